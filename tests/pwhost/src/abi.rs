//! The proxy-wasm ABI (0.2.1) as this host speaks it: status codes, the numbers of
//! header maps and buffers, the wire form of a header map and of a property path,
//! and moving bytes in and out of the guest's memory.
//!
//! Bytes the host hands the guest live in memory the guest allocated: the host calls
//! the guest's own `malloc` export, and the guest frees them (the SDK takes them as a
//! `Vec`).

use crate::vm::VmState;
use wasmtime::{format_err, Caller, Extern, Memory, Result};

/// A host call's result, as the ABI numbers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum Status {
    /// Done.
    Ok = 0,
    /// No such key, property, queue or context.
    NotFound = 1,
    /// An argument the host cannot take.
    BadArgument = 2,
    /// The queue is empty.
    Empty = 7,
    /// Shared data changed since the value was read.
    CasMismatch = 8,
    /// The host failed.
    InternalFailure = 10,
    /// The host does not provide this call.
    Unimplemented = 12,
}

impl Status {
    /// As the ABI returns it.
    pub fn code(self) -> i32 {
        self as i32
    }
}

/// The header maps of the ABI (`proxy_get_header_map_pairs` and the rest).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapType {
    /// The request's headers (pseudo-headers included).
    RequestHeaders,
    /// The response's headers.
    ResponseHeaders,
    /// The headers of the answer to an HTTP call (`proxy_http_call`).
    HttpCallResponseHeaders,
    /// Any other map (trailers, gRPC metadata).
    Other,
}

impl MapType {
    /// The map numbered `n`.
    pub fn of(n: i32) -> MapType {
        match n {
            0 => MapType::RequestHeaders,
            2 => MapType::ResponseHeaders,
            6 => MapType::HttpCallResponseHeaders,
            _ => MapType::Other,
        }
    }
}

/// The buffers of the ABI (`proxy_get_buffer_bytes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferType {
    /// The request's body.
    RequestBody,
    /// The response's body.
    ResponseBody,
    /// The VM's configuration.
    VmConfiguration,
    /// The plugin's configuration.
    PluginConfiguration,
    /// The body of the answer to an HTTP call.
    HttpCallResponseBody,
    /// Any other buffer (gRPC answers, connection data).
    Other,
}

impl BufferType {
    /// The buffer numbered `n`.
    pub fn of(n: i32) -> BufferType {
        match n {
            0 => BufferType::RequestBody,
            1 => BufferType::ResponseBody,
            4 => BufferType::HttpCallResponseBody,
            6 => BufferType::VmConfiguration,
            7 => BufferType::PluginConfiguration,
            _ => BufferType::Other,
        }
    }
}

/// A header map in the ABI's wire form: the count, each name's and value's length
/// (little-endian u32s), then each name and value followed by a NUL.
pub fn encode_map(pairs: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = (pairs.len() as u32).to_le_bytes().to_vec();
    for (name, value) in pairs {
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    }
    for (name, value) in pairs {
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        out.extend_from_slice(value);
        out.push(0);
    }
    out
}

/// A header map from the ABI's wire form; `None` when it does not parse.
pub fn decode_map(bytes: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    let word = |at: usize| -> Option<usize> {
        let b = bytes.get(at..at + 4)?;
        Some(u32::from_le_bytes(b.try_into().ok()?) as usize)
    };
    let count = word(0)?;
    let mut at = 4 + count.checked_mul(8)?;
    let mut pairs = Vec::with_capacity(count);
    for i in 0..count {
        let (name_len, value_len) = (word(4 + 8 * i)?, word(8 + 8 * i)?);
        let name = bytes.get(at..at + name_len)?;
        at += name_len + 1;
        let value = bytes.get(at..at + value_len)?;
        at += value_len + 1;
        pairs.push((String::from_utf8_lossy(name).into_owned(), value.to_vec()));
    }
    Some(pairs)
}

/// A property path from the ABI's wire form: its parts, NUL-separated, joined by dots.
pub fn property_path(bytes: &[u8]) -> String {
    bytes.split(|b| *b == 0).map(String::from_utf8_lossy).collect::<Vec<_>>().join(".")
}

fn memory(caller: &mut Caller<'_, VmState>) -> Result<Memory> {
    caller.get_export("memory").and_then(Extern::into_memory).ok_or_else(|| format_err!("the guest exports no memory"))
}

/// `len` bytes of the guest's memory at `ptr`.
pub fn read(caller: &mut Caller<'_, VmState>, ptr: i32, len: i32) -> Result<Vec<u8>> {
    let memory = memory(caller)?;
    let mut out = vec![0; len as u32 as usize];
    memory
        .read(&*caller, ptr as u32 as usize, &mut out)
        .map_err(|_| format_err!("a guest pointer out of its memory"))?;
    Ok(out)
}

/// `len` bytes of the guest's memory at `ptr`, as text (names, keys, log lines).
pub fn read_text(caller: &mut Caller<'_, VmState>, ptr: i32, len: i32) -> Result<String> {
    Ok(String::from_utf8_lossy(&read(caller, ptr, len)?).into_owned())
}

/// Write `bytes` into the guest's memory at `ptr`.
pub fn write(caller: &mut Caller<'_, VmState>, ptr: i32, bytes: &[u8]) -> Result<()> {
    let memory = memory(caller)?;
    memory.write(&mut *caller, ptr as u32 as usize, bytes).map_err(|_| format_err!("a guest pointer out of its memory"))
}

/// Write a little-endian u32 at `ptr`.
pub fn write_u32(caller: &mut Caller<'_, VmState>, ptr: i32, value: u32) -> Result<()> {
    write(caller, ptr, &value.to_le_bytes())
}

/// Hand `bytes` to the guest: copied into memory its `malloc` gives, with the
/// address written at `ptr_at` and the length at `len_at`.
pub fn give(caller: &mut Caller<'_, VmState>, bytes: &[u8], ptr_at: i32, len_at: i32) -> Result<()> {
    let malloc = caller
        .get_export("malloc")
        .and_then(Extern::into_func)
        .ok_or_else(|| format_err!("the guest exports no malloc"))?
        .typed::<i32, i32>(&*caller)?;
    let ptr = malloc.call(&mut *caller, bytes.len() as i32)?;
    if ptr == 0 && !bytes.is_empty() {
        return Err(format_err!("the guest's malloc gave no memory"));
    }
    write(caller, ptr, bytes)?;
    write_u32(caller, ptr_at, ptr as u32)?;
    write_u32(caller, len_at, bytes.len() as u32)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_header_map_survives_its_wire_form() {
        let pairs = vec![(":method".to_owned(), b"PUT".to_vec()), ("empty".to_owned(), Vec::new())];
        assert_eq!(decode_map(&encode_map(&pairs)).unwrap(), pairs);
        assert_eq!(decode_map(&[3, 0, 0, 0]), None, "a count with no lengths after it");
    }

    #[test]
    fn a_property_path_is_its_parts_joined_by_dots() {
        assert_eq!(property_path(b"response\0code_details"), "response.code_details");
    }
}
