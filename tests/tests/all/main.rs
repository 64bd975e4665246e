//! Fencekeeper's integration and end-to-end tests, one test binary (tests/README.md
//! lists what each module covers). One binary rather than one per file: each test
//! binary links wasmtime, so 38 of them cost minutes of linking in CI. Run one topic
//! with a filter on its module, e.g. `cargo test --release -p fencekeeper-tests
//! --test all e2e_envoy_gate::`.
//!
//! Modules named `e2e_*` drive real Envoy, gateways, nginx, etcd and ZooKeeper;
//! `postgres_*` and `redis_module_*` real PostgreSQL and redis-server with the
//! extension and the module loaded; the rest run the library against real services.

mod concurrency;
mod conformance;
mod crash;
mod e2e_clients;
mod e2e_conditional;
mod e2e_envoy;
mod e2e_envoy_auth;
mod e2e_envoy_conditional;
mod e2e_envoy_config;
mod e2e_envoy_gate;
mod e2e_envoy_provenance;
mod e2e_envoy_remote_filter;
mod e2e_envoy_tls_store;
mod e2e_etcd_failover;
mod e2e_etcd_tls;
mod e2e_filter_faults;
mod e2e_gateway;
mod e2e_gateway_contract;
mod e2e_gateway_envoy;
mod e2e_gateway_etcd;
mod e2e_gateway_faults;
mod e2e_gateway_gate;
mod e2e_gateway_provenance;
mod e2e_gateway_stall;
mod e2e_gateway_start_grace;
mod e2e_gateway_store_damage;
mod e2e_gateway_tls;
mod e2e_provenance_etcd;
mod e2e_provenance_zookeeper;
mod e2e_retention;
mod e2e_s3;
mod e2e_shared_gate;
mod e2e_tokens_etcd;
mod e2e_tokens_redis;
mod e2e_tokens_zookeeper;
mod http_contract;
mod http_fenced_bodies;
mod late_writes;
mod metrics_rules;
mod postgres_concurrency;
mod postgres_crash;
mod postgres_extension;
mod postgres_hostile;
mod postgres_import;
mod postgres_presented;
mod redis_module;
mod redis_module_concurrency;
mod redis_module_hostile;
mod redis_module_pause;
mod redis_module_persistence;
mod redis_module_replication;
mod tokens_consul;
mod tokens_contract;
mod tokens_contract_http;
mod tokens_contract_postgres;
mod tokens_contract_redis;
