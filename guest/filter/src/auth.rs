//! etcd's user/password authentication, per VM.
//!
//! etcd trades a user name and password for a token (`etcdserverpb.Auth/Authenticate`);
//! every later call carries it as the metadata `token`. A token dies
//! `--auth-token-ttl` seconds (default 300) after its last use, or when etcd
//! restarts, and etcd then answers UNAUTHENTICATED
//! ([`fencekeeper_etcd_wire::grpc::token_refused`]).
//!
//! The token is kept per VM (one per Envoy worker), shared by its requests: the
//! first request that needs etcd and finds no token authenticates, then makes its
//! call; a request whose call is refused for its token drops that token (unless a
//! newer one replaced it meanwhile), authenticates again and retries its call once.
//!
//! The root's own calls (the in-flight registry's lease grants, passes and deletes,
//! the confirm batches) carry the token too. One refused for its token drops it and
//! authenticates again from the root ([`Auth::root_refused`]): with no write coming,
//! nothing else would, and the registry's lease would lapse.
//!
//! Requests that find no token at the same moment each authenticate (each answer
//! stores the token, the last one stays): a proxy-wasm HTTP context only receives
//! the answers of calls it dispatched itself, so a request waiting on another's
//! authentication would need the root context to run its etcd calls for it. That
//! costs etcd one password hash per request in flight on the worker when the token
//! is missing, once per token lifetime; requests that arrive after a token is
//! stored, and retries that find a newer token than the one refused, do not
//! authenticate.

use crate::env::{self, Secret};
use crate::etcd::{self, Method, Response};
use fencekeeper_etcd_wire as wire;
use fencekeeper_filter_config::Etcd;
use std::cell::{Cell, RefCell};

/// The user, the password and the current token of one VM.
pub struct Auth {
    /// The etcd user name (logged; the password and the token never are).
    pub user: String,
    password: Secret,
    token: RefCell<Option<String>>,
    /// Bumped with every stored token: a refused token is only dropped when it is
    /// still the current one.
    generation: Cell<u64>,
    /// The root's authentication in flight (its call), if any.
    root_call: Cell<Option<u32>>,
}

impl Auth {
    /// Authenticate as `user`, with the password from the VM's environment variable
    /// `password_env` (read now: a missing variable stops the filter from starting).
    pub fn new(user: &str, password_env: &str) -> Result<Auth, env::EnvError> {
        Ok(Auth {
            user: user.to_owned(),
            password: env::secret(password_env)?,
            token: RefCell::new(None),
            generation: Cell::new(0),
            root_call: Cell::new(None),
        })
    }

    /// The current token and its generation, if there is one.
    pub fn token(&self) -> Option<(String, u64)> {
        self.token.borrow().clone().map(|t| (t, self.generation.get()))
    }

    /// The body of an authentication. The caller wipes it once it is sent.
    pub fn body(&self) -> Vec<u8> {
        wire::grpc::authenticate(&self.user, self.password.expose())
    }

    /// Keep a new token.
    pub fn store(&self, token: String) {
        self.generation.set(self.generation.get().wrapping_add(1));
        *self.token.borrow_mut() = Some(token);
    }

    /// A call of the root's (its context is the effective one) was refused for its
    /// token: drop the token and authenticate again from the root, unless it is under
    /// way. The refused call is not made again here: each of the root's calls has its
    /// own retry (a lease grant after its retry period, a pass by its write).
    pub fn root_refused(&self, e: &Etcd) {
        if self.root_call.get().is_some() {
            return;
        }
        if let Some((_, generation)) = self.token() {
            self.refused(generation);
        }
        let body = self.body();
        match etcd::call(e, Method::Authenticate, None, &body) {
            Ok(call) => self.root_call.set(Some(call)),
            Err(why) => log::warn!("fencekeeper: could not authenticate to etcd again as {:?}: {why}", self.user),
        }
        // It carries the password: not left in memory the VM hands out again.
        env::wipe(body);
    }

    /// The answer to the root's call `call`: true when it was the root's
    /// authentication (its token is then kept, or why not logged).
    pub fn root_answered(&self, call: u32, response: &Response) -> bool {
        if self.root_call.get() != Some(call) {
            return false;
        }
        self.root_call.set(None);
        if let Err(why) = self.accept(response) {
            log::warn!("fencekeeper: {why}");
        }
        true
    }

    /// An authentication's answer: its token kept (and logged), or why there is none,
    /// on one line.
    pub fn accept(&self, response: &Response) -> Result<(), String> {
        match wire::grpc::parse_authentication(response.as_deref()) {
            Ok(token) => {
                self.store(token);
                log::info!("fencekeeper: authenticated to etcd as {:?}", self.user);
                Ok(())
            }
            Err(wire::AuthRefusal::WrongCredentials(e)) => {
                Err(format!("etcd authentication failed for user {:?}: wrong user name or password ({e})", self.user))
            }
            Err(wire::AuthRefusal::Other(e)) => {
                Err(format!("etcd authentication failed for user {:?}: {e}", self.user))
            }
        }
    }

    /// etcd refused the token of `generation`: drop it, unless another request has
    /// stored a newer one since.
    pub fn refused(&self, generation: u64) {
        if self.generation.get() == generation {
            *self.token.borrow_mut() = None;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_token_is_dropped_only_while_it_is_the_current_one() {
        std::env::set_var("FK_TEST_AUTH_PASSWORD", "pw\"1");
        let auth = Auth::new("fk", "FK_TEST_AUTH_PASSWORD").unwrap();
        assert_eq!(auth.token(), None);
        // AuthenticateRequest: name (1), password (2).
        assert_eq!(auth.body(), b"\x0a\x02fk\x12\x04pw\"1");
        auth.store("t1".into());
        let (_, first) = auth.token().unwrap();
        auth.store("t2".into());
        auth.refused(first);
        assert_eq!(auth.token().map(|(t, _)| t).as_deref(), Some("t2"), "a newer token stays");
        let (_, second) = auth.token().unwrap();
        auth.refused(second);
        assert_eq!(auth.token(), None);
        assert!(Auth::new("fk", "FK_TEST_AUTH_UNSET").is_err());
    }
}
