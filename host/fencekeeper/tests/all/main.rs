//! The library's integration tests, one binary (a module per topic, each module's doc
//! says what it covers). Run one topic with a filter on its module, e.g. `cargo test
//! --release -p fencekeeper --test all file_store::`. `tests/engine_settings.rs` is a
//! binary of its own: it needs a process in which no other test made the engine.

mod file_store;
mod file_store_corruption;
mod file_store_disk_full;
mod file_store_journal;
mod guest_faults;
mod hostile_guests;
mod retention;
mod store_contract;
#[path = "../support/wat_guest.rs"]
mod wat_guest;
