//! Where marks live in etcd: key = prefix + resource (default prefix
//! [`DEFAULT_PREFIX`]), and the range end etcd takes for "every key under a prefix".

/// The default key prefix of marks, shared by the gateway, the library and the filter.
pub const DEFAULT_PREFIX: &str = "/fencekeeper/marks/";

/// The etcd key of `resource`'s mark under `prefix`.
pub fn mark_key(prefix: &str, resource: &str) -> String {
    format!("{prefix}{resource}")
}

/// The etcd key of `resource`'s version chain (conditional writes) beside marks under
/// `prefix`: the prefix with `.chains` in place of its last `/` (`/fencekeeper/marks.chains/`
/// + resource), outside the marks' range, so listing marks never meets one.
pub fn chain_key(prefix: &str, resource: &str) -> String {
    format!("{}.chains/{resource}", prefix.trim_end_matches('/'))
}

/// The smallest key above every key that starts with `prefix` (etcd's prefix range end).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_the_next_key_after_the_prefix() {
        assert_eq!(mark_key(DEFAULT_PREFIX, "a/b"), "/fencekeeper/marks/a/b");
        assert_eq!(prefix_end(b"/fencekeeper/marks/"), b"/fencekeeper/marks0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(&[0xff]), vec![0]);
    }
}
