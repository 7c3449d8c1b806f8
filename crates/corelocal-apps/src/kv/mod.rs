//! memcached text-protocol server.
