//! Felix tokens from untrusted bytes: `felix_meta::auth::verify` on the input as a token,
//! and on the input "forged" into one (the bytes split into a header and a claims part, each
//! base64url-encoded, so random bytes reach the JSON parsers), plus `Permission::parse` and
//! pattern matching on the input as text. Each must return a value or a typed error; a panic
//! is a bug. The state holds one real key, so inputs that name its kid reach the signature
//! check. The same inputs go to the OIDC exchange's `verify_oidc`, against one registered
//! issuer whose JWKS holds that key (so forged tokens naming `iss` "fuzz" and kid `k1` reach
//! its signature check); a forged token must never verify there either.

#![no_main]

use std::sync::OnceLock;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use felix_meta::auth::{
    self, AuthState, OidcIssuer, Permission, Resource, ResourcePattern, SigningKey,
};
use libfuzzer_sys::fuzz_target;

fn state() -> &'static AuthState {
    static STATE: OnceLock<AuthState> = OnceLock::new();
    STATE.get_or_init(|| {
        let mut key = SigningKey::generate(0).expect("an Ed25519 key");
        key.kid = "k1".into();
        let mut state = AuthState::default();
        let jwks = format!(
            r#"{{"keys":[{{"kty":"OKP","crv":"Ed25519","kid":"k1","x":"{}"}}]}}"#,
            key.public
        );
        state.keys.insert(key.kid.clone(), key);
        let issuer = OidcIssuer {
            issuer: "fuzz".into(),
            audience: "felix".into(),
            jwks,
            tenant: None,
            tenant_claim: Some("org".into()),
            subject_claim: "sub".into(),
            roles_claim: Some("groups".into()),
            role_map: [("g".to_owned(), "r".to_owned())].into(),
            default_roles: vec![],
            ttl_secs: 900,
        };
        state.issuers.insert(issuer.issuer.clone(), issuer);
        state
    })
}

fuzz_target!(|data: &[u8]| {
    let state = state();
    let text = String::from_utf8_lossy(data);
    let _ = auth::verify(&text, state, 1);
    let _ = auth::verify_oidc(&text, &state.issuers, None, 1);

    let mut parts = data.splitn(3, |&b| b == 0xff);
    let header = parts.next().unwrap_or_default();
    let claims = parts.next().unwrap_or_default();
    let signature = parts.next().unwrap_or_default();
    let forged = format!(
        "{}.{}.{}",
        URL_SAFE_NO_PAD.encode(header),
        URL_SAFE_NO_PAD.encode(claims),
        URL_SAFE_NO_PAD.encode(signature)
    );
    if let Ok(c) = auth::verify(&forged, state, 1) {
        panic!("a forged token verified: {c:?}");
    }
    if let Ok(i) = auth::verify_oidc(&forged, &state.issuers, Some("t"), 1) {
        panic!("a forged IdP token verified: {i:?}");
    }

    let _ = Permission::parse(&text);
    if let Ok(p) = ResourcePattern::parse(&text) {
        let mut segs = text.split('/');
        let r = Resource::stream(
            segs.next().unwrap_or_default(),
            segs.next().unwrap_or_default(),
            segs.next().unwrap_or_default(),
        );
        let _ = (p.matches(&r), p.touches(&r), p.matches(&Resource::Cluster));
    }
});
