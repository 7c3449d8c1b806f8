//! HTTP/1.1: request parser and response builder (sans-IO).
