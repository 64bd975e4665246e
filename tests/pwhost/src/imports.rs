//! The host calls the filter imports, as the profile provides them.
//!
//! Every call acts on the *effective* context: the one whose callback runs, or the
//! one `proxy_set_effective_context` switched to, where the profile switches. A call
//! a real host would crash or misbehave on (answering the root context, which has no
//! request) is recorded as a violation and refused, so a test sees it.

use crate::abi::{self, BufferType, MapType, Status};
use crate::vm::{Callout, LocalReply, VmState};
use wasmtime::{format_err, Caller, Linker, Result};

type C<'a> = Caller<'a, VmState>;

/// Define every host call of the profile in `linker`.
pub fn define(linker: &mut Linker<VmState>) -> Result<()> {
    integration(linker)?;
    headers(linker)?;
    buffers_and_properties(linker)?;
    shared(linker)?;
    streams(linker)?;
    calls(linker)?;
    wasi(linker)?;
    Ok(())
}

fn integration(l: &mut Linker<VmState>) -> Result<()> {
    l.func_wrap("env", "proxy_log", |mut c: C<'_>, level: i32, ptr: i32, len: i32| -> Result<i32> {
        let text = abi::read_text(&mut c, ptr, len)?;
        let worker = c.data().worker;
        c.data().world.borrow_mut().logs.push(crate::world::LogLine { worker, level, text });
        Ok(Status::Ok.code())
    })?;
    l.func_wrap("env", "proxy_get_current_time_nanoseconds", |mut c: C<'_>, at: i32| -> Result<i32> {
        let now = c.data().world.borrow().now_ms.saturating_mul(1_000_000);
        abi::write(&mut c, at, &now.to_le_bytes())?;
        Ok(Status::Ok.code())
    })?;
    l.func_wrap("env", "proxy_set_tick_period_milliseconds", |mut c: C<'_>, period: i32| -> i32 {
        let now = c.data().world.borrow().now_ms;
        let vm = c.data_mut();
        vm.tick_ms = u64::from(period as u32);
        vm.next_tick = now + vm.tick_ms;
        Status::Ok.code()
    })?;
    l.func_wrap("env", "proxy_set_effective_context", |mut c: C<'_>, context: i32| -> i32 {
        let vm = c.data_mut();
        let context = context as u32;
        if !vm.profile.switches_context {
            return Status::Ok.code(); // ngx_wasm_module: OK, and nothing switched
        }
        if context == vm.root || vm.streams.contains_key(&context) {
            vm.effective = context;
            return Status::Ok.code();
        }
        Status::BadArgument.code()
    })?;
    l.func_wrap("env", "proxy_done", || Status::Ok.code())?;
    l.func_wrap(
        "env",
        "proxy_define_metric",
        |mut c: C<'_>, _kind: i32, ptr: i32, len: i32, at: i32| -> Result<i32> {
            let name = abi::read_text(&mut c, ptr, len)?;
            let id = {
                let mut w = c.data().world.borrow_mut();
                w.metrics.entry(name.clone()).or_insert(0);
                w.metric_names.push(name);
                w.metric_names.len() as u32
            };
            abi::write_u32(&mut c, at, id)?;
            Ok(Status::Ok.code())
        },
    )?;
    l.func_wrap("env", "proxy_increment_metric", |c: C<'_>, id: i32, by: i64| -> i32 {
        let mut w = c.data().world.borrow_mut();
        let Some(name) = (id as usize).checked_sub(1).and_then(|i| w.metric_names.get(i)).cloned() else {
            return Status::NotFound.code();
        };
        *w.metrics.entry(name).or_insert(0) += by;
        Status::Ok.code()
    })?;
    l.func_wrap("env", "proxy_call_foreign_function", |_: i32, _: i32, _: i32, _: i32, _: i32, _: i32| {
        Status::NotFound.code()
    })?;
    Ok(())
}

/// The effective stream's header map of type `map`, or why there is none.
fn map_of(vm: &mut VmState, map: i32) -> std::result::Result<&mut Vec<(String, Vec<u8>)>, Status> {
    let kind = MapType::of(map);
    if kind == MapType::HttpCallResponseHeaders {
        // Only inside `proxy_on_http_call_response`, in any context.
        return vm.call_answer.as_mut().map(|a| &mut a.headers).ok_or(Status::NotFound);
    }
    let Some(stream) = vm.stream() else { return Err(Status::BadArgument) };
    match kind {
        MapType::RequestHeaders => Ok(&mut stream.request),
        MapType::ResponseHeaders => Ok(&mut stream.response),
        MapType::HttpCallResponseHeaders | MapType::Other => Err(Status::NotFound),
    }
}

fn headers(l: &mut Linker<VmState>) -> Result<()> {
    l.func_wrap(
        "env",
        "proxy_get_header_map_pairs",
        |mut c: C<'_>, map: i32, ptr_at: i32, len_at: i32| -> Result<i32> {
            let bytes = match map_of(c.data_mut(), map) {
                Ok(pairs) => abi::encode_map(pairs),
                Err(s) => return Ok(s.code()),
            };
            abi::give(&mut c, &bytes, ptr_at, len_at)?;
            Ok(Status::Ok.code())
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_header_map_value",
        |mut c: C<'_>, map: i32, kp: i32, kl: i32, ptr_at: i32, len_at: i32| -> Result<i32> {
            let name = abi::read_text(&mut c, kp, kl)?;
            let value = match map_of(c.data_mut(), map) {
                Ok(pairs) => pairs.iter().find(|(n, _)| n.eq_ignore_ascii_case(&name)).map(|(_, v)| v.clone()),
                Err(s) => return Ok(s.code()),
            };
            let Some(value) = value else { return Ok(Status::NotFound.code()) };
            abi::give(&mut c, &value, ptr_at, len_at)?;
            Ok(Status::Ok.code())
        },
    )?;
    l.func_wrap("env", "proxy_set_header_map_pairs", |mut c: C<'_>, map: i32, ptr: i32, len: i32| -> Result<i32> {
        let bytes = abi::read(&mut c, ptr, len)?;
        let pairs = abi::decode_map(&bytes).ok_or_else(|| format_err!("a header map that does not parse"))?;
        Ok(match map_of(c.data_mut(), map) {
            Ok(map) => {
                *map = pairs;
                Status::Ok.code()
            }
            Err(s) => s.code(),
        })
    })?;
    for (name, replace) in [("proxy_add_header_map_value", false), ("proxy_replace_header_map_value", true)] {
        l.func_wrap("env", name, move |mut c: C<'_>, map: i32, kp: i32, kl: i32, vp: i32, vl: i32| -> Result<i32> {
            let key = abi::read_text(&mut c, kp, kl)?;
            let value = abi::read(&mut c, vp, vl)?;
            Ok(match map_of(c.data_mut(), map) {
                Ok(map) => {
                    if replace {
                        map.retain(|(n, _)| !n.eq_ignore_ascii_case(&key));
                    }
                    map.push((key, value));
                    Status::Ok.code()
                }
                Err(s) => s.code(),
            })
        })?;
    }
    l.func_wrap("env", "proxy_remove_header_map_value", |mut c: C<'_>, map: i32, kp: i32, kl: i32| -> Result<i32> {
        let key = abi::read_text(&mut c, kp, kl)?;
        Ok(match map_of(c.data_mut(), map) {
            Ok(map) => {
                map.retain(|(n, _)| !n.eq_ignore_ascii_case(&key));
                Status::Ok.code()
            }
            Err(s) => s.code(),
        })
    })?;
    Ok(())
}

/// What a property is on this host for the effective context, if it is one.
fn property(vm: &mut VmState, path: &str) -> Option<Vec<u8>> {
    let code_details = vm.profile.code_details;
    let stream = vm.stream();
    match path {
        "source.address" => stream.map(|_| b"127.0.0.1:40000".to_vec()),
        "response.code_details" if code_details => stream?.code_details.clone().map(String::into_bytes),
        "response.code" => {
            let stream = stream?;
            stream.response.iter().find(|(n, _)| n == ":status").map(|(_, v)| v.clone())
        }
        _ => None,
    }
}

fn buffers_and_properties(l: &mut Linker<VmState>) -> Result<()> {
    l.func_wrap(
        "env",
        "proxy_get_buffer_bytes",
        |mut c: C<'_>, kind: i32, start: i32, max: i32, ptr_at: i32, len_at: i32| -> Result<i32> {
            let vm = c.data_mut();
            let whole = match BufferType::of(kind) {
                BufferType::PluginConfiguration => vm.plugin_config.clone(),
                BufferType::VmConfiguration | BufferType::Other => Vec::new(),
                BufferType::RequestBody => vm.stream().map(|s| s.body.clone()).unwrap_or_default(),
                BufferType::ResponseBody => vm.stream().map(|s| s.response_body.clone()).unwrap_or_default(),
                BufferType::HttpCallResponseBody => vm.call_answer.as_ref().map(|a| a.body.clone()).unwrap_or_default(),
            };
            let start = (start as u32 as usize).min(whole.len());
            let end = start.saturating_add(max as u32 as usize).min(whole.len());
            if start == end {
                return Ok(Status::NotFound.code());
            }
            abi::give(&mut c, &whole[start..end], ptr_at, len_at)?;
            Ok(Status::Ok.code())
        },
    )?;
    l.func_wrap("env", "proxy_set_buffer_bytes", |_: i32, _: i32, _: i32, _: i32, _: i32| Status::Ok.code())?;
    l.func_wrap(
        "env",
        "proxy_get_property",
        |mut c: C<'_>, pp: i32, pl: i32, ptr_at: i32, len_at: i32| -> Result<i32> {
            let path = abi::property_path(&abi::read(&mut c, pp, pl)?);
            let Some(value) = property(c.data_mut(), &path) else { return Ok(Status::NotFound.code()) };
            abi::give(&mut c, &value, ptr_at, len_at)?;
            Ok(Status::Ok.code())
        },
    )?;
    l.func_wrap("env", "proxy_set_property", |_: i32, _: i32, _: i32, _: i32| Status::Ok.code())?;
    Ok(())
}

/// ngx_wasm_module traps on a shared-data key whose namespace nginx.conf does not declare.
fn kv_namespace(c: &C<'_>, key: &str) -> Result<()> {
    if c.data().profile.kv_declared(key) {
        return Ok(());
    }
    Err(format_err!("failed getting or setting {key:?} in shm (could not resolve namespace)"))
}

fn shared(l: &mut Linker<VmState>) -> Result<()> {
    l.func_wrap(
        "env",
        "proxy_get_shared_data",
        |mut c: C<'_>, kp: i32, kl: i32, ptr_at: i32, len_at: i32, cas_at: i32| -> Result<i32> {
            let key = abi::read_text(&mut c, kp, kl)?;
            kv_namespace(&c, &key)?;
            let found = c.data().world.borrow().shared.get(&key).cloned();
            let Some((value, cas)) = found else { return Ok(Status::NotFound.code()) };
            abi::give(&mut c, &value, ptr_at, len_at)?;
            abi::write_u32(&mut c, cas_at, cas)?;
            Ok(Status::Ok.code())
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_shared_data",
        |mut c: C<'_>, kp: i32, kl: i32, vp: i32, vl: i32, cas: i32| -> Result<i32> {
            let key = abi::read_text(&mut c, kp, kl)?;
            kv_namespace(&c, &key)?;
            let value = abi::read(&mut c, vp, vl)?;
            let set = c.data().world.borrow_mut().set_shared(&key, Some(value), cas as u32);
            Ok(if set { Status::Ok } else { Status::CasMismatch }.code())
        },
    )?;
    l.func_wrap("env", "proxy_register_shared_queue", |mut c: C<'_>, np: i32, nl: i32, at: i32| -> Result<i32> {
        let name = abi::read_text(&mut c, np, nl)?;
        if !c.data().profile.queue_declared(&name) {
            if !c.data().profile.undeclared_queue_traps {
                return Ok(Status::NotFound.code());
            }
            // ngx_wasm_module traps here: only queues nginx.conf declares exist.
            return Err(format_err!("could not find queue {name:?} (not declared)"));
        }
        let worker = c.data().worker;
        let id = c.data().world.borrow_mut().register_queue(&name, worker);
        abi::write_u32(&mut c, at, id)?;
        Ok(Status::Ok.code())
    })?;
    l.func_wrap(
        "env",
        "proxy_resolve_shared_queue",
        |mut c: C<'_>, _vp: i32, _vl: i32, np: i32, nl: i32, at: i32| -> Result<i32> {
            if c.data().profile.declared_queues.is_some() {
                return Ok(Status::Unimplemented.code());
            }
            let name = abi::read_text(&mut c, np, nl)?;
            let id = c.data().world.borrow().queues.iter().position(|q| q.name == name);
            let Some(id) = id else { return Ok(Status::NotFound.code()) };
            abi::write_u32(&mut c, at, id as u32 + 1)?;
            Ok(Status::Ok.code())
        },
    )?;
    l.func_wrap("env", "proxy_enqueue_shared_queue", |mut c: C<'_>, id: i32, vp: i32, vl: i32| -> Result<i32> {
        let value = abi::read(&mut c, vp, vl)?;
        let notify = c.data().profile.queue_ready;
        let mut w = c.data().world.borrow_mut();
        let Some(queue) = w.queue(id as u32) else { return Ok(Status::NotFound.code()) };
        queue.items.push_back(value);
        let owner = queue.owner;
        if notify {
            w.ready.push_back((owner, id as u32));
        }
        Ok(Status::Ok.code())
    })?;
    l.func_wrap(
        "env",
        "proxy_dequeue_shared_queue",
        |mut c: C<'_>, id: i32, ptr_at: i32, len_at: i32| -> Result<i32> {
            let item = {
                let mut w = c.data().world.borrow_mut();
                let Some(queue) = w.queue(id as u32) else { return Ok(Status::NotFound.code()) };
                queue.items.pop_front()
            };
            let Some(item) = item else { return Ok(Status::Empty.code()) };
            abi::give(&mut c, &item, ptr_at, len_at)?;
            Ok(Status::Ok.code())
        },
    )?;
    Ok(())
}

fn streams(l: &mut Linker<VmState>) -> Result<()> {
    l.func_wrap("env", "proxy_continue_stream", |mut c: C<'_>, _kind: i32| -> i32 {
        let vm = c.data_mut();
        let effective = vm.effective;
        let Some(stream) = vm.stream() else {
            vm.violation(format!("proxy_continue_stream with the root context ({effective}) effective: no request"));
            return Status::BadArgument.code();
        };
        stream.resume = true;
        vm.touched.push(effective);
        Status::Ok.code()
    })?;
    l.func_wrap("env", "proxy_close_stream", |_: i32| Status::Ok.code())?;
    l.func_wrap(
        "env",
        "proxy_send_local_response",
        |mut c: C<'_>, status: i32, dp: i32, dl: i32, bp: i32, bl: i32, hp: i32, hl: i32, grpc: i32| -> Result<i32> {
            let details = abi::read_text(&mut c, dp, dl)?;
            let mut body = abi::read(&mut c, bp, bl)?;
            let mut headers = abi::decode_map(&abi::read(&mut c, hp, hl)?).unwrap_or_default();
            let mut status = status;
            if grpc >= 0 {
                // As Envoy answers a gRPC request locally: trailers-only, HTTP 200, the
                // status and the body as its message.
                headers.push(("grpc-status".to_owned(), grpc.to_string().into_bytes()));
                headers.push(("grpc-message".to_owned(), std::mem::take(&mut body)));
                headers.push(("content-type".to_owned(), b"application/grpc".to_vec()));
                status = 200;
            }
            let vm = c.data_mut();
            let effective = vm.effective;
            let Some(stream) = vm.stream() else {
                // ngx_wasm_module answers the root's (absent) request here and crashes.
                vm.violation(format!(
                    "proxy_send_local_response {status} with the root context ({effective}) effective"
                ));
                return Ok(Status::BadArgument.code());
            };
            if stream.answered || stream.local.is_some() {
                // (A local reply while the upstream's answer is in the filter's hands,
                // before it went on, replaces that answer: `answered` is set after.)
                vm.violation(format!("a second answer ({status}) to the request of context {effective}"));
                return Ok(Status::BadArgument.code());
            }
            stream.local = Some(LocalReply { status: status as u16, headers, body, details });
            vm.touched.push(effective);
            Ok(Status::Ok.code())
        },
    )?;
    Ok(())
}

fn calls(l: &mut Linker<VmState>) -> Result<()> {
    l.func_wrap(
        "env",
        "proxy_http_call",
        |mut c: C<'_>,
         up: i32,
         ul: i32,
         hp: i32,
         hl: i32,
         bp: i32,
         bl: i32,
         _tp: i32,
         _tl: i32,
         timeout_ms: i32,
         at: i32|
         -> Result<i32> {
            if !c.data().callouts {
                // No HTTP upstream for callouts behind this host.
                return Ok(Status::BadArgument.code());
            }
            let upstream = abi::read_text(&mut c, up, ul)?;
            let headers = abi::read(&mut c, hp, hl)?;
            let headers = abi::decode_map(&headers).ok_or_else(|| format_err!("a call's headers that do not parse"))?;
            let body = abi::read(&mut c, bp, bl)?;
            // Answered once the callback returns, as a real host does.
            let vm = c.data_mut();
            let token = vm.next_token;
            vm.next_token += 1;
            let callout = Callout { upstream, headers, body, timeout_ms: timeout_ms as u32 };
            vm.http.push((vm.effective, token, callout));
            abi::write_u32(&mut c, at, token)?;
            Ok(Status::Ok.code())
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_grpc_call",
        |mut c: C<'_>,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         at: i32|
         -> Result<i32> {
            c.data().world.borrow_mut().grpc_calls += 1;
            if !c.data().profile.grpc {
                return Ok(Status::Unimplemented.code());
            }
            // Dispatched; answered UNAVAILABLE once the callback returns (there is no
            // etcd behind this host).
            let vm = c.data_mut();
            let token = vm.next_token;
            vm.next_token += 1;
            vm.grpc.push((vm.effective, token));
            abi::write_u32(&mut c, at, token)?;
            Ok(Status::Ok.code())
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_grpc_stream",
        |_: i32, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32| Status::Unimplemented.code(),
    )?;
    l.func_wrap("env", "proxy_grpc_send", |_: i32, _: i32, _: i32, _: i32| Status::Unimplemented.code())?;
    l.func_wrap("env", "proxy_grpc_cancel", |_: i32| Status::Ok.code())?;
    l.func_wrap("env", "proxy_grpc_close", |_: i32| Status::Ok.code())?;
    l.func_wrap("env", "proxy_get_status", |mut c: C<'_>, code_at: i32, ptr_at: i32, len_at: i32| -> Result<i32> {
        abi::write_u32(&mut c, code_at, 14)?;
        abi::give(&mut c, b"no etcd behind the test host", ptr_at, len_at)?;
        Ok(Status::Ok.code())
    })?;
    Ok(())
}

/// WASI preview 1, as much as the filter imports: an empty environment, and random
/// bytes from the proxy's seeded generator (so runs repeat).
fn wasi(l: &mut Linker<VmState>) -> Result<()> {
    const WASI: &str = "wasi_snapshot_preview1";
    l.func_wrap(WASI, "environ_sizes_get", |mut c: C<'_>, count_at: i32, size_at: i32| -> Result<i32> {
        abi::write_u32(&mut c, count_at, 0)?;
        abi::write_u32(&mut c, size_at, 0)?;
        Ok(0)
    })?;
    l.func_wrap(WASI, "environ_get", |_: i32, _: i32| 0)?;
    l.func_wrap(WASI, "random_get", |mut c: C<'_>, ptr: i32, len: i32| -> Result<i32> {
        let mut bytes = Vec::with_capacity(len as u32 as usize);
        while bytes.len() < len as u32 as usize {
            let word = c.data().world.borrow_mut().random();
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        bytes.truncate(len as u32 as usize);
        abi::write(&mut c, ptr, &bytes)?;
        Ok(0)
    })?;
    Ok(())
}
