//! MegaPipe RPC framing (sans-IO).
