//! The filter's plugin configuration: JSON, every field optional. The type and its
//! rules live in `fencekeeper-filter-config` (crates/filter-config), which
//! `fencekeeper envoy-config` writes with; docs/envoy.md is the reference for each
//! field.

pub use fencekeeper_filter_config::*;
