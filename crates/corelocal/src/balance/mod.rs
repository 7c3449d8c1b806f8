//! The Affinity-Accept balancer (seed 000 §3.3): pure, deterministic policy code with time
//! passed in, and the many-core simulator that drives it.
