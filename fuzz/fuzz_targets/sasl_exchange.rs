//! A Kafka client's SASL message from untrusted bytes: the PLAIN and OAUTHBEARER parsers
//! (`felix_meta::auth::SaslMechanism::token`) on the input as is, and on the input "forged"
//! into each mechanism's shape (the bytes split at `0xff` into fields joined by NUL for
//! PLAIN, and into key=value pairs between 0x01 for OAUTHBEARER) so random bytes reach past
//! the framing. Each must return a token slice of the input or a typed `SaslError`; a panic
//! is a bug. A token that comes out is then verified as the broker would, against a state
//! with one real key: it must never verify.

#![no_main]

use std::sync::OnceLock;

use felix_meta::auth::{self, AuthState, SaslMechanism, SigningKey};
use libfuzzer_sys::fuzz_target;

fn state() -> &'static AuthState {
    static STATE: OnceLock<AuthState> = OnceLock::new();
    STATE.get_or_init(|| {
        let mut key = SigningKey::generate(0).expect("an Ed25519 key");
        key.kid = "k1".into();
        let mut state = AuthState::default();
        state.keys.insert(key.kid.clone(), key);
        state
    })
}

fn check(mechanism: SaslMechanism, message: &[u8]) {
    if let Ok(token) = mechanism.token(message) {
        assert!(!token.is_empty(), "an empty token was accepted");
        let start = token.as_ptr() as usize - message.as_ptr() as usize;
        assert!(start + token.len() <= message.len(), "the token is a slice of the input");
        if let Ok(c) = auth::verify(token, state(), 1) {
            panic!("a fuzzed SASL token verified: {c:?}");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    for m in SaslMechanism::ALL {
        check(m, data);
    }
    let fields: Vec<&[u8]> = data.split(|&b| b == 0xff).collect();
    let plain = fields.join(&0u8);
    check(SaslMechanism::Plain, &plain);
    let mut oauth = b"n,,\x01".to_vec();
    for f in &fields {
        oauth.extend_from_slice(f);
        oauth.push(1);
    }
    oauth.push(1);
    check(SaslMechanism::OAuthBearer, &oauth);
    let _ = SaslMechanism::parse(&String::from_utf8_lossy(data));
});
