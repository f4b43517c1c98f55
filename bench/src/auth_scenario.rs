//! The `auth-checks` scenario: what each authorization step costs on one core, no network.
//!
//! Measures the three steps a broker with auth on takes (docs/security.md): verifying a
//! token's signature and form (`felix_meta::auth::verify`, once per connection or per
//! `Authenticate`), expanding its roles (`Principal::new`, again only when roles or bindings
//! change), and the per-request check (`check_live` then `Principal::check` on a stream:
//! what every publish and subscribe pays). The token is a tenant-admin token of `bench`, as
//! bench/auth.sh presents; the state holds `--roles` other roles and `--revoked` revoked ids,
//! so lookups are not measured on empty maps. Prints one JSON line: nanoseconds per call of
//! each step, the mean over `--iterations` calls.

use std::hint::black_box;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use felix_meta::auth::{
    self, Action, AuthState, Claims, Permission, Principal, Resource, SigningKey,
};
use serde::Serialize;

use crate::common::print_line;

#[derive(Args, Debug, Clone)]
pub struct AuthArgs {
    /// Calls of each step.
    #[arg(long, default_value_t = 20_000)]
    iterations: u32,
    /// Other roles in the state.
    #[arg(long, default_value_t = 100)]
    roles: u32,
    /// Revoked token ids in the state.
    #[arg(long, default_value_t = 1000)]
    revoked: u32,
}

#[derive(Serialize)]
struct AuthReport {
    scenario: &'static str,
    iterations: u32,
    /// Signature and form check of one token (once per connection).
    verify_ns: f64,
    /// Role expansion (once per connection, and after a role or binding change).
    expand_ns: f64,
    /// Expiry, revocation and grant check (every request).
    per_request_ns: f64,
}

fn per_call(iterations: u32, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..iterations {
        f();
    }
    start.elapsed().as_nanos() as f64 / f64::from(iterations)
}

pub fn run(args: AuthArgs) -> anyhow::Result<()> {
    let now = auth::now_secs();
    let key = SigningKey::generate(now).context("generate a signing key")?;
    let mut state = AuthState::default();
    state.keys.insert(key.kid.clone(), key.clone());
    for i in 0..args.roles {
        let grant = Permission::parse(&format!("stream.subscribe:t{i}/*")).context("grant")?;
        state.roles.insert(format!("role-{i}"), [grant].into());
    }
    for i in 0..args.revoked {
        state.revoked.insert(format!("revoked-{i}"), now + 3600);
    }
    let claims = Claims {
        tenant: "bench".into(),
        sub: "bench".into(),
        exp: now + 3600,
        iat: now,
        jti: auth::random_id(16),
        namespace: "default".into(),
        roles: vec!["tenant-admin".into()],
        allow: vec![],
    };
    let token = auth::mint(&key, &claims).context("mint")?;
    let stream = Resource::stream("bench", "pubsub", "orders");

    let verify_ns = per_call(args.iterations, || {
        black_box(auth::verify(black_box(&token), &state, now).is_ok());
    });
    let verified = auth::verify(&token, &state, now).context("verify")?;
    let expand_ns = per_call(args.iterations, || {
        black_box(Principal::new(black_box(verified.clone()), &state));
    });
    let principal = Principal::new(verified.clone(), &state);
    let per_request_ns = per_call(args.iterations, || {
        let live = auth::check_live(black_box(&verified), &state, now).is_ok();
        let allowed = principal
            .check(Action::StreamPublish, black_box(&stream))
            .is_ok();
        black_box(live && allowed);
    });
    print_line(&AuthReport {
        scenario: "auth-checks",
        iterations: args.iterations,
        verify_ns,
        expand_ns,
        per_request_ns,
    })
}
