//! Signing and verifying Felix tokens: EdDSA (Ed25519) JWTs and nothing else.
//!
//! Decides which tokens are genuine. A token is accepted only if its header says `EdDSA`,
//! names a `kid` the control plane holds and that still verifies, its signature checks
//! against that key, its claims parse completely, it has not expired and its id is not
//! revoked. `none`, HMAC, RSA and ECDSA tokens are refused before any key is looked at, so
//! a public key can never be used as an HMAC secret. The invariant: [`verify`] and
//! [`check_live`] never panic, whatever bytes they are given (a fuzz target,
//! `fuzz/fuzz_targets/token_parse.rs`, holds it), and every refusal has a stable
//! [`TokenError::reason`].

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};

use super::claims::{Claims, MAX_TOKEN_LEN};
use super::state::{AuthState, SigningKey};

/// Why a token was refused. Each kind has a stable reason string for the wire.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// No token was presented.
    #[error("this broker requires a token (auth is on); present one in hello or authenticate")]
    Missing,
    /// Not a well-formed, genuine Felix token: the detail says why, for logs.
    #[error("the token is not valid: {0}")]
    Invalid(String),
    #[error("the token has expired; present a fresh one")]
    Expired,
    #[error("the token has been revoked")]
    Revoked,
}

impl TokenError {
    /// The stable reason: `missing_token`, `invalid_token`, `token_expired`, `token_revoked`.
    pub fn reason(&self) -> &'static str {
        match self {
            TokenError::Missing => "missing_token",
            TokenError::Invalid(_) => "invalid_token",
            TokenError::Expired => "token_expired",
            TokenError::Revoked => "token_revoked",
        }
    }
}

fn invalid(why: impl Into<String>) -> TokenError {
    TokenError::Invalid(why.into())
}

/// Random bytes from aws-lc-rs, hex-encoded: key ids and token ids.
pub fn random_id(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    // Filling from the system's generator fails only if the OS has no entropy source, in
    // which case no key or token id could be made safely: fall back to refusing loudly.
    aws_lc_rs::rand::fill(&mut buf).expect("the system random generator is unavailable");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

impl SigningKey {
    /// A new Ed25519 key pair with a random kid.
    pub fn generate(created_at: u64) -> Result<SigningKey, TokenError> {
        use aws_lc_rs::signature::{Ed25519KeyPair, KeyPair};
        let rng = aws_lc_rs::rand::SystemRandom::new();
        let doc = Ed25519KeyPair::generate_pkcs8(&rng)
            .map_err(|_| invalid("could not generate an Ed25519 key"))?;
        let pair = Ed25519KeyPair::from_pkcs8(doc.as_ref())
            .map_err(|_| invalid("could not read back a generated Ed25519 key"))?;
        Ok(SigningKey {
            kid: random_id(8),
            private_pkcs8: STANDARD.encode(doc.as_ref()),
            public: URL_SAFE_NO_PAD.encode(pair.public_key().as_ref()),
            created_at,
            retire_at: None,
        })
    }
}

/// Signs `claims` with `key` (header: `alg` EdDSA, `typ` JWT, `kid`).
pub fn mint(key: &SigningKey, claims: &Claims) -> Result<String, TokenError> {
    let pkcs8 = STANDARD
        .decode(&key.private_pkcs8)
        .map_err(|_| invalid("the signing key is not base64"))?;
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = Some(key.kid.clone());
    jsonwebtoken::encode(&header, claims, &EncodingKey::from_ed_der(&pkcs8))
        .map_err(|e| invalid(format!("signing failed: {e}")))
}

/// Verifies a token's form and signature against the keys in `state`, then checks it is
/// live at `now` (seconds since the epoch). The expensive part (the signature) is here;
/// callers that cache the result re-run only [`check_live`] per request.
pub fn verify(token: &str, state: &AuthState, now: u64) -> Result<Claims, TokenError> {
    let claims = verify_signature(token, state, now)?;
    check_live(&claims, state, now)?;
    Ok(claims)
}

/// The signature and form checks of [`verify`], without expiry or revocation.
pub fn verify_signature(token: &str, state: &AuthState, now: u64) -> Result<Claims, TokenError> {
    let token = token.trim();
    if token.is_empty() {
        return Err(TokenError::Missing);
    }
    if token.len() > MAX_TOKEN_LEN {
        return Err(invalid("longer than any Felix token"));
    }
    let header = jsonwebtoken::decode_header(token).map_err(|e| invalid(e.to_string()))?;
    if header.alg != Algorithm::EdDSA {
        return Err(invalid(format!(
            "algorithm {:?}: Felix tokens are EdDSA only",
            header.alg
        )));
    }
    let kid = header.kid.ok_or_else(|| invalid("no kid in the header"))?;
    let key = state
        .verifying_key(&kid, now)
        .ok_or_else(|| invalid("unknown or retired signing key"))?;
    let public = URL_SAFE_NO_PAD
        .decode(&key.public)
        .map_err(|_| invalid("the signing key's public half is not base64url"))?;
    let mut validation = Validation::new(Algorithm::EdDSA);
    // Expiry is checked by `check_live` so it can answer `token_expired` distinctly and be
    // re-checked per request; `exp` is still required, by `Claims`.
    validation.validate_exp = false;
    validation.validate_aud = false;
    validation.required_spec_claims.clear();
    let data =
        jsonwebtoken::decode::<Claims>(token, &DecodingKey::from_ed_der(&public), &validation)
            .map_err(|e| invalid(e.to_string()))?;
    let claims = data.claims;
    if claims.tenant.is_empty() || claims.sub.is_empty() || claims.jti.is_empty() {
        return Err(invalid("empty tenant, subject or token id"));
    }
    Ok(claims)
}

/// The per-request checks: not expired at `now`, not revoked in `state`.
pub fn check_live(claims: &Claims, state: &AuthState, now: u64) -> Result<(), TokenError> {
    if now >= claims.exp {
        return Err(TokenError::Expired);
    }
    if state.is_revoked(&claims.jti) {
        return Err(TokenError::Revoked);
    }
    Ok(())
}

/// Seconds since the Unix epoch, from the system clock.
pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state_with_key() -> (AuthState, SigningKey) {
        let key = SigningKey::generate(100).unwrap();
        let mut state = AuthState::default();
        state.keys.insert(key.kid.clone(), key.clone());
        (state, key)
    }

    fn claims(exp: u64) -> Claims {
        Claims {
            tenant: "acme".into(),
            sub: "svc".into(),
            exp,
            iat: 100,
            jti: "t1".into(),
            namespace: "default".into(),
            roles: vec!["tenant-admin".into()],
            allow: vec![],
        }
    }

    #[test]
    fn a_minted_token_verifies_until_it_expires_or_is_revoked() {
        let (mut state, key) = state_with_key();
        let token = mint(&key, &claims(200)).unwrap();
        assert_eq!(verify(&token, &state, 150).unwrap(), claims(200));
        assert_eq!(verify(&token, &state, 200), Err(TokenError::Expired));
        state.revoked.insert("t1".into(), 200);
        assert_eq!(verify(&token, &state, 150), Err(TokenError::Revoked));
    }

    #[test]
    fn tokens_of_another_key_or_a_retired_key_are_invalid() {
        let (mut state, key) = state_with_key();
        let other = SigningKey::generate(100).unwrap();
        let mut forged = mint(&other, &claims(200)).unwrap();
        // Same kid as the real key, signed by another: the signature fails.
        let mut c = claims(200);
        c.jti = "t2".into();
        let fake_kid = SigningKey {
            kid: key.kid.clone(),
            ..other.clone()
        };
        let wrong_sig = mint(&fake_kid, &c).unwrap();
        assert_eq!(
            verify(&forged, &state, 150).unwrap_err().reason(),
            "invalid_token"
        );
        assert_eq!(
            verify(&wrong_sig, &state, 150).unwrap_err().reason(),
            "invalid_token"
        );
        forged = mint(&key, &claims(200)).unwrap();
        state.keys.get_mut(&key.kid).unwrap().retire_at = Some(150);
        assert!(verify(&forged, &state, 149).is_ok());
        assert_eq!(
            verify(&forged, &state, 150).unwrap_err().reason(),
            "invalid_token"
        );
    }

    #[test]
    fn alg_none_and_hmac_with_the_public_key_are_refused() {
        let (state, key) = state_with_key();
        let b64 = |s: &str| URL_SAFE_NO_PAD.encode(s);
        let body = b64(&serde_json::to_string(&claims(200)).unwrap());
        let none = format!(
            "{}.{body}.",
            b64(&format!(r#"{{"alg":"none","kid":"{}"}}"#, key.kid))
        );
        assert_eq!(
            verify(&none, &state, 150).unwrap_err().reason(),
            "invalid_token"
        );
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some(key.kid.clone());
        let hs = jsonwebtoken::encode(
            &header,
            &claims(200),
            &EncodingKey::from_secret(key.public.as_bytes()).unwrap(),
        )
        .unwrap();
        assert_eq!(
            verify(&hs, &state, 150).unwrap_err().reason(),
            "invalid_token"
        );
        for junk in ["", "a", "a.b", "a.b.c", "...", "\u{0}\u{1}.x.y"] {
            assert!(verify(junk, &state, 150).is_err());
        }
        assert_eq!(verify("  ", &state, 150), Err(TokenError::Missing));
    }
}
