//! RPC microbenchmark server.
