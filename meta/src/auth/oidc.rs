//! Trusting an identity provider: registered OIDC issuers, and verifying their tokens.
//!
//! Decides whether a JWT from an identity provider (IdP) proves who its bearer is, and what
//! Felix identity it maps to (tenant, subject, roles). An operator registers each trusted
//! issuer in the control plane ([`OidcIssuer`], replicated like roles, so every broker
//! answers alike); [`verify_oidc`] checks a token against the issuer its `iss` names: the
//! algorithm (asymmetric only: RS*, PS*, ES256/ES384, EdDSA; `none` and HMAC are refused
//! before anything else is read, so a public key can never serve as an HMAC secret), the
//! signature against the issuer's JWKS, the audience, expiry and not-before. Pure logic:
//! the clock is an argument and nothing here does I/O. The invariant: every refusal is an
//! [`OidcError`] with a stable [`reason`](OidcError::reason) whose message names nothing of
//! the registered issuers, and nothing here panics on bytes from the network.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::claims::ALL_TENANTS;
use super::claims::MAX_TOKEN_LEN;

/// How long an exchanged Felix token lives unless the issuer says otherwise (never past the
/// IdP token's own expiry).
pub const DEFAULT_EXCHANGE_TTL_SECS: u64 = 15 * 60;

/// The longest an issuer may set its exchanged tokens to live: an exchanged token is meant
/// to be short-lived and fetched again from the IdP.
pub const MAX_EXCHANGE_TTL_SECS: u64 = 12 * 3600;

/// Clock skew tolerated on `nbf` (an IdP whose clock runs ahead). Expiry gets none: a token
/// is not exchanged for one that would be dead on arrival.
pub const NBF_LEEWAY_SECS: u64 = 60;

/// Largest JWKS document kept: it lives in every broker's replicated state, and real key
/// sets are a few KiB.
pub const MAX_JWKS_LEN: usize = 64 * 1024;

/// The algorithms an IdP token may use.
const ACCEPTED: [Algorithm; 9] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

fn default_subject_claim() -> String {
    "sub".to_owned()
}

fn default_ttl() -> u64 {
    DEFAULT_EXCHANGE_TTL_SECS
}

/// A trusted identity provider, as registered (`felixctl oidc issuer add`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OidcIssuer {
    /// The `iss` its tokens carry, compared exactly.
    pub issuer: String,
    /// The `aud` its tokens must carry (one of, if a list) to be meant for Felix.
    pub audience: String,
    /// The issuer's JSON Web Key Set, as a document (public keys only).
    pub jwks: String,
    /// Every token of this issuer acts for this tenant; or else:
    #[serde(default)]
    pub tenant: Option<String>,
    /// the claim holding the tenant.
    #[serde(default)]
    pub tenant_claim: Option<String>,
    /// The claim holding the subject (role bindings are per subject).
    #[serde(default = "default_subject_claim")]
    pub subject_claim: String,
    /// The claim holding the IdP's groups or roles (a string list, or a space-separated
    /// string), mapped through `role_map`.
    #[serde(default)]
    pub roles_claim: Option<String>,
    /// IdP group → Felix role name. Groups not listed give nothing.
    #[serde(default)]
    pub role_map: BTreeMap<String, String>,
    /// Felix roles every exchanged token of this issuer gets.
    #[serde(default)]
    pub default_roles: Vec<String>,
    /// Lifetime of an exchanged token, seconds (capped by the IdP token's own expiry).
    #[serde(default = "default_ttl")]
    pub ttl_secs: u64,
}

impl OidcIssuer {
    /// Whether the registration is complete and consistent (checked when it is applied, so
    /// the control plane never holds an issuer that cannot verify anything).
    pub fn validate(&self) -> Result<(), String> {
        if self.issuer.is_empty() || self.issuer.len() > 1024 {
            return Err("an issuer is 1 to 1024 characters (its tokens' iss)".into());
        }
        if self.audience.is_empty() {
            return Err("an issuer needs the audience its tokens carry for Felix".into());
        }
        match (&self.tenant, &self.tenant_claim) {
            (Some(_), Some(_)) | (None, None) => {
                return Err("map the tenant either to a fixed tenant or to a claim".into());
            }
            (Some(t), None) if t.is_empty() || t == ALL_TENANTS || t.contains('/') => {
                return Err(format!("{t:?} is not a tenant an issuer can map to"));
            }
            (None, Some(c)) if c.is_empty() => return Err("the tenant claim is empty".into()),
            _ => {}
        }
        if self.subject_claim.is_empty() {
            return Err("the subject claim is empty".into());
        }
        if self.ttl_secs == 0 || self.ttl_secs > MAX_EXCHANGE_TTL_SECS {
            return Err(format!(
                "an exchanged token lives between 1 s and {MAX_EXCHANGE_TTL_SECS} s (12 h)"
            ));
        }
        if self.jwks.len() > MAX_JWKS_LEN {
            return Err(format!("the JWKS is over {MAX_JWKS_LEN} bytes"));
        }
        let keys = self.key_set()?;
        if !keys.keys.iter().any(usable) {
            return Err(
                "the JWKS holds no usable signing key (RSA, EC P-256/P-384 or Ed25519)".into(),
            );
        }
        Ok(())
    }

    /// The issuer's keys, parsed.
    pub fn key_set(&self) -> Result<JwkSet, String> {
        serde_json::from_str(&self.jwks).map_err(|e| format!("the JWKS is not valid: {e}"))
    }

    /// The key ids its JWKS lists (for listing).
    pub fn key_ids(&self) -> Vec<String> {
        self.key_set()
            .map(|s| s.keys.into_iter().filter_map(|k| k.common.key_id).collect())
            .unwrap_or_default()
    }

    /// The Felix roles it may give: the defaults and every mapped one.
    pub fn roles_named(&self) -> impl Iterator<Item = &str> {
        self.default_roles
            .iter()
            .chain(self.role_map.values())
            .map(String::as_str)
    }
}

/// A key Felix can verify with.
fn usable(k: &Jwk) -> bool {
    match &k.algorithm {
        AlgorithmParameters::RSA(_) => true,
        AlgorithmParameters::EllipticCurve(p) => {
            matches!(p.curve, EllipticCurve::P256 | EllipticCurve::P384)
        }
        AlgorithmParameters::OctetKeyPair(p) => p.curve == EllipticCurve::Ed25519,
        _ => false,
    }
}

/// Whether key `k` can check a signature made with `alg`.
fn fits(k: &Jwk, alg: Algorithm) -> bool {
    if let Some(ka) = k.common.key_algorithm {
        let same = serde_json::to_value(ka).ok() == serde_json::to_value(alg).ok();
        if !same {
            return false;
        }
    }
    match (&k.algorithm, alg) {
        (
            AlgorithmParameters::RSA(_),
            Algorithm::RS256
            | Algorithm::RS384
            | Algorithm::RS512
            | Algorithm::PS256
            | Algorithm::PS384
            | Algorithm::PS512,
        ) => true,
        (AlgorithmParameters::EllipticCurve(p), Algorithm::ES256) => p.curve == EllipticCurve::P256,
        (AlgorithmParameters::EllipticCurve(p), Algorithm::ES384) => p.curve == EllipticCurve::P384,
        (AlgorithmParameters::OctetKeyPair(p), Algorithm::EdDSA) => {
            p.curve == EllipticCurve::Ed25519
        }
        _ => false,
    }
}

/// Why an IdP token was refused. Each kind has a stable reason for the wire and metrics.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OidcError {
    #[error("no identity provider token was given")]
    Missing,
    #[error("the token is not a well-formed JWT: {0}")]
    Malformed(String),
    #[error("algorithm {0}: identity provider tokens must be RS*, PS*, ES256, ES384 or EdDSA")]
    UnsupportedAlgorithm(String),
    #[error("the token's issuer is not registered as trusted")]
    UnknownIssuer,
    #[error("the token is signed with a trusted issuer's key but names another issuer")]
    WrongIssuer,
    #[error("the issuer's key set has no key the token names")]
    UnknownKey,
    #[error("the token's signature does not verify against the issuer's keys")]
    BadSignature,
    #[error("the token is not meant for this audience")]
    WrongAudience,
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet (nbf)")]
    NotYetValid,
    #[error("the token lacks the claim {0:?} the issuer's mapping needs")]
    MissingClaim(String),
    #[error("the claim {0:?} does not name a usable tenant or subject")]
    BadClaim(String),
    #[error("the token maps to another tenant than the one asked for")]
    TenantMismatch,
}

impl OidcError {
    /// The stable reason.
    pub fn reason(&self) -> &'static str {
        match self {
            OidcError::Missing => "missing_token",
            OidcError::Malformed(_) => "malformed_token",
            OidcError::UnsupportedAlgorithm(_) => "unsupported_algorithm",
            OidcError::UnknownIssuer => "unknown_issuer",
            OidcError::WrongIssuer => "wrong_issuer",
            OidcError::UnknownKey => "unknown_key",
            OidcError::BadSignature => "bad_signature",
            OidcError::WrongAudience => "wrong_audience",
            OidcError::Expired => "expired",
            OidcError::NotYetValid => "not_yet_valid",
            OidcError::MissingClaim(_) => "missing_claim",
            OidcError::BadClaim(_) => "bad_claim",
            OidcError::TenantMismatch => "tenant_mismatch",
        }
    }

    /// Every reason [`reason`](Self::reason) can give.
    pub const REASONS: [&'static str; 13] = [
        "missing_token",
        "malformed_token",
        "unsupported_algorithm",
        "unknown_issuer",
        "wrong_issuer",
        "unknown_key",
        "bad_signature",
        "wrong_audience",
        "expired",
        "not_yet_valid",
        "missing_claim",
        "bad_claim",
        "tenant_mismatch",
    ];
}

/// Who a verified IdP token says its bearer is, in Felix's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OidcIdentity {
    pub issuer: String,
    pub tenant: String,
    pub sub: String,
    /// Felix role names, sorted, without repeats.
    pub roles: Vec<String>,
    /// The IdP token's expiry (seconds since the epoch).
    pub exp: u64,
    /// The issuer's lifetime for exchanged tokens.
    pub ttl_secs: u64,
}

impl OidcIdentity {
    /// When a Felix token exchanged at `now` expires: the issuer's lifetime, never past the
    /// IdP token's own expiry.
    pub fn felix_expiry(&self, now: u64) -> u64 {
        now.saturating_add(self.ttl_secs).min(self.exp)
    }
}

fn part(s: &str, what: &str) -> Result<Value, OidcError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(s.trim_end_matches('='))
        .map_err(|_| OidcError::Malformed(format!("the {what} is not base64url")))?;
    serde_json::from_slice(&bytes)
        .map_err(|_| OidcError::Malformed(format!("the {what} is not JSON")))
}

fn number(v: Option<&Value>) -> Option<u64> {
    let v = v?;
    v.as_u64()
        .or_else(|| v.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
}

/// Whether `token` is shaped like an identity provider's JWT: it claims an issuer (`iss`,
/// unverified). Felix's own tokens carry none, so a listener that takes both kinds can tell
/// which verifier's refusal to report.
pub fn claims_an_issuer(token: &str) -> bool {
    let mut parts = token.trim().split('.');
    let (Some(_), Some(payload), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    part(payload, "payload").is_ok_and(|p| p.get("iss").and_then(Value::as_str).is_some())
}

/// Verifies an IdP token against the registered `issuers` at `now`, and maps it. With
/// `tenant`, the token must map to that tenant ([`OidcError::TenantMismatch`] otherwise).
pub fn verify_oidc(
    token: &str,
    issuers: &BTreeMap<String, OidcIssuer>,
    tenant: Option<&str>,
    now: u64,
) -> Result<OidcIdentity, OidcError> {
    let token = token.trim();
    if token.is_empty() {
        return Err(OidcError::Missing);
    }
    if token.len() > MAX_TOKEN_LEN {
        return Err(OidcError::Malformed(
            "longer than any accepted token".into(),
        ));
    }
    let parts: Vec<&str> = token.split('.').collect();
    let [header, payload, _signature] = parts.as_slice() else {
        return Err(OidcError::Malformed(
            "a JWT has three dot-separated parts".into(),
        ));
    };
    let header = part(header, "header")?;
    let alg_name = header
        .get("alg")
        .and_then(Value::as_str)
        .ok_or_else(|| OidcError::Malformed("no alg in the header".into()))?;
    // `none` and HMAC are refused on their name, before a key is chosen.
    let alg = alg_name
        .parse::<Algorithm>()
        .ok()
        .filter(|a| ACCEPTED.contains(a))
        .ok_or_else(|| OidcError::UnsupportedAlgorithm(alg_name.chars().take(16).collect()))?;
    let kid = header.get("kid").and_then(Value::as_str);
    let unverified = part(payload, "payload")?;
    let iss = unverified
        .get("iss")
        .and_then(Value::as_str)
        .ok_or_else(|| OidcError::MissingClaim("iss".into()))?;
    let Some(issuer) = issuers.get(iss) else {
        // A trusted issuer's key naming another issuer is a token minted for somewhere
        // else (or tampered with): said apart from a token of a stranger.
        let known_kid = kid.is_some_and(|kid| {
            issuers
                .values()
                .any(|i| i.key_set().is_ok_and(|s| s.find(kid).is_some()))
        });
        return Err(if known_kid {
            OidcError::WrongIssuer
        } else {
            OidcError::UnknownIssuer
        });
    };
    let keys = issuer.key_set().map_err(|_| OidcError::UnknownKey)?;
    let candidates: Vec<&Jwk> = match kid {
        Some(kid) => keys
            .keys
            .iter()
            .filter(|k| k.common.key_id.as_deref() == Some(kid))
            .collect(),
        None => keys.keys.iter().filter(|k| fits(k, alg)).collect(),
    };
    if candidates.is_empty() {
        return Err(OidcError::UnknownKey);
    }
    let mut validation = Validation::new(alg);
    // Expiry, not-before and audience are checked below, each with its own reason.
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = false;
    validation.required_spec_claims.clear();
    let claims = candidates
        .iter()
        .filter(|k| fits(k, alg))
        .filter_map(|k| DecodingKey::from_jwk(k).ok())
        .find_map(|key| jsonwebtoken::decode::<Value>(token, &key, &validation).ok())
        .map(|data| data.claims)
        .ok_or(OidcError::BadSignature)?;
    let audience_ok = match claims.get("aud") {
        Some(Value::String(a)) => *a == issuer.audience,
        Some(Value::Array(list)) => list.iter().any(|a| a.as_str() == Some(&issuer.audience)),
        _ => false,
    };
    if !audience_ok {
        return Err(OidcError::WrongAudience);
    }
    let exp = number(claims.get("exp")).ok_or_else(|| OidcError::MissingClaim("exp".into()))?;
    if now >= exp {
        return Err(OidcError::Expired);
    }
    if let Some(nbf) = number(claims.get("nbf"))
        && now.saturating_add(NBF_LEEWAY_SECS) < nbf
    {
        return Err(OidcError::NotYetValid);
    }
    let claim_str = |name: &str| -> Result<String, OidcError> {
        match claims.get(name) {
            Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            Some(_) => Err(OidcError::BadClaim(name.into())),
            None => Err(OidcError::MissingClaim(name.into())),
        }
    };
    let mapped_tenant = match (&issuer.tenant, &issuer.tenant_claim) {
        (Some(t), _) => t.clone(),
        (None, Some(c)) => claim_str(c)?,
        (None, None) => return Err(OidcError::MissingClaim("tenant".into())),
    };
    // Never a cluster-wide identity, whatever the IdP says.
    if mapped_tenant == ALL_TENANTS || mapped_tenant.contains('/') {
        return Err(OidcError::BadClaim(
            issuer.tenant_claim.clone().unwrap_or_default(),
        ));
    }
    if tenant.is_some_and(|t| t != mapped_tenant) {
        return Err(OidcError::TenantMismatch);
    }
    let sub = claim_str(&issuer.subject_claim)?;
    let mut roles: Vec<String> = issuer.default_roles.clone();
    if let Some(name) = &issuer.roles_claim {
        let groups: Vec<&str> = match claims.get(name) {
            Some(Value::Array(list)) => list.iter().filter_map(Value::as_str).collect(),
            Some(Value::String(s)) => s.split_whitespace().collect(),
            _ => Vec::new(),
        };
        roles.extend(
            groups
                .into_iter()
                .filter_map(|g| issuer.role_map.get(g).cloned()),
        );
    }
    roles.sort();
    roles.dedup();
    Ok(OidcIdentity {
        issuer: issuer.issuer.clone(),
        tenant: mapped_tenant,
        sub,
        roles,
        exp,
        ttl_secs: issuer.ttl_secs,
    })
}

#[cfg(test)]
mod tests {
    use aws_lc_rs::rand::SystemRandom;
    use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};

    use super::*;

    const ISS: &str = "https://idp.example";

    /// An EC P-256 key pair and its JWK (kid `ec1`).
    fn ec_key() -> (EcdsaKeyPair, Value) {
        let rng = SystemRandom::new();
        let doc = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let pair =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, doc.as_ref()).unwrap();
        let point = pair.public_key().as_ref().to_vec();
        let jwk = serde_json::json!({
            "kty": "EC", "crv": "P-256", "kid": "ec1", "alg": "ES256", "use": "sig",
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&point[33..65]),
        });
        (pair, jwk)
    }

    fn sign(pair: &EcdsaKeyPair, header: &Value, claims: &Value) -> String {
        let b64 = |v: &Value| URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap());
        let message = format!("{}.{}", b64(header), b64(claims));
        let sig = pair.sign(&SystemRandom::new(), message.as_bytes()).unwrap();
        format!("{message}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
    }

    fn issuers(jwk: &Value) -> BTreeMap<String, OidcIssuer> {
        let issuer = OidcIssuer {
            issuer: ISS.into(),
            audience: "felix".into(),
            jwks: serde_json::json!({ "keys": [jwk] }).to_string(),
            tenant: None,
            tenant_claim: Some("org".into()),
            subject_claim: "email".into(),
            roles_claim: Some("groups".into()),
            role_map: [("writers".to_owned(), "writer".to_owned())].into(),
            default_roles: vec!["reader".into()],
            ttl_secs: 900,
        };
        issuer.validate().unwrap();
        [(ISS.to_owned(), issuer)].into()
    }

    fn claims() -> Value {
        serde_json::json!({
            "iss": ISS, "aud": ["other", "felix"], "exp": 2000, "nbf": 900, "iat": 900,
            "org": "acme", "email": "ana@acme.example", "groups": ["writers", "unmapped"],
        })
    }

    #[test]
    fn a_genuine_token_maps_to_tenant_subject_and_roles() {
        let (pair, jwk) = ec_key();
        let header = serde_json::json!({"alg": "ES256", "kid": "ec1", "typ": "JWT"});
        let token = sign(&pair, &header, &claims());
        let who = verify_oidc(&token, &issuers(&jwk), Some("acme"), 1000).unwrap();
        assert_eq!(
            (who.tenant.as_str(), who.sub.as_str()),
            ("acme", "ana@acme.example")
        );
        assert_eq!(who.roles, ["reader", "writer"]);
        assert_eq!(who.felix_expiry(1000), 1900);
        assert_eq!(who.felix_expiry(1500), 2000, "never past the IdP's expiry");
        // Without a kid, the issuer's fitting keys are tried.
        let token = sign(&pair, &serde_json::json!({"alg": "ES256"}), &claims());
        assert!(verify_oidc(&token, &issuers(&jwk), None, 1000).is_ok());
    }

    #[test]
    fn each_defect_is_refused_with_its_reason() {
        let (pair, jwk) = ec_key();
        let (other, _) = ec_key();
        let issuers = issuers(&jwk);
        let header = serde_json::json!({"alg": "ES256", "kid": "ec1"});
        let with = |k: &str, v: Value| {
            let mut c = claims();
            c[k] = v;
            c
        };
        let reason = |token: &str, tenant: Option<&str>, now: u64| {
            verify_oidc(token, &issuers, tenant, now)
                .unwrap_err()
                .reason()
        };
        let good = sign(&pair, &header, &claims());
        assert_eq!(reason(&good, Some("acme"), 2000), "expired");
        assert_eq!(reason(&good, Some("acme"), 800), "not_yet_valid");
        assert_eq!(reason(&good, Some("globex"), 1000), "tenant_mismatch");
        let forged = sign(&other, &header, &claims());
        assert_eq!(reason(&forged, None, 1000), "bad_signature");
        let aud = sign(&pair, &header, &with("aud", "someone-else".into()));
        assert_eq!(reason(&aud, None, 1000), "wrong_audience");
        let iss = sign(&pair, &header, &with("iss", "https://evil.example".into()));
        assert_eq!(reason(&iss, None, 1000), "wrong_issuer");
        let stranger = sign(
            &other,
            &serde_json::json!({"alg": "ES256", "kid": "x"}),
            &with("iss", "https://evil.example".into()),
        );
        assert_eq!(reason(&stranger, None, 1000), "unknown_issuer");
        let kid = sign(
            &pair,
            &serde_json::json!({"alg": "ES256", "kid": "nope"}),
            &claims(),
        );
        assert_eq!(reason(&kid, None, 1000), "unknown_key");
        let star = sign(&pair, &header, &with("org", "*".into()));
        assert_eq!(reason(&star, None, 1000), "bad_claim");
        let mut no_sub = claims();
        no_sub.as_object_mut().unwrap().remove("email");
        assert_eq!(
            reason(&sign(&pair, &header, &no_sub), None, 1000),
            "missing_claim"
        );
        // `none` and HMAC (keyed with the public JWK, the classic confusion) by name.
        let b64 = |v: &Value| URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap());
        for alg in ["none", "None", "HS256", "HS512"] {
            let token = format!(
                "{}.{}.c2ln",
                b64(&serde_json::json!({"alg": alg, "kid": "ec1"})),
                b64(&claims())
            );
            assert_eq!(reason(&token, None, 1000), "unsupported_algorithm", "{alg}");
        }
        for junk in ["", "a", "a.b", "a.b.c.d", "...", "\u{0}.x.y", "e30.e30.e30"] {
            let e = verify_oidc(junk, &issuers, None, 1000).unwrap_err();
            assert!(
                matches!(e.reason(), "missing_token" | "malformed_token"),
                "{junk:?}: {e:?}"
            );
        }
    }

    #[test]
    fn a_registration_must_be_complete() {
        let (_, jwk) = ec_key();
        let good = issuers(&jwk).remove(ISS).unwrap();
        let both = OidcIssuer {
            tenant: Some("acme".into()),
            ..good.clone()
        };
        assert!(both.validate().is_err());
        let star = OidcIssuer {
            tenant: Some("*".into()),
            tenant_claim: None,
            ..good.clone()
        };
        assert!(star.validate().is_err());
        let hmac = OidcIssuer {
            jwks: r#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#.into(),
            ..good.clone()
        };
        assert!(hmac.validate().is_err(), "a shared secret is no issuer key");
        let huge = OidcIssuer {
            jwks: format!("{}{}", " ".repeat(MAX_JWKS_LEN), good.jwks),
            ..good.clone()
        };
        assert!(huge.validate().is_err(), "a JWKS over 64 KiB");
        let long = OidcIssuer {
            ttl_secs: MAX_EXCHANGE_TTL_SECS + 1,
            ..good
        };
        assert!(long.validate().is_err());
    }
}
