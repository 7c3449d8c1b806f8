//! The memcached text protocol (sans-IO).
