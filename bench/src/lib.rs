//! dmattn's benchmark cases and result files (the format in `bench/SCHEMA.md`), shared by the
//! `dmattn-bench` binary, `bench/peers.py` (through the JSON) and `cargo xtask bench`.
pub mod cases;
pub mod results;
