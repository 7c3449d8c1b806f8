//! Static HTTP/1.1 file server.
