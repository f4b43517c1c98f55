//! How a Felix token travels in a SASL exchange: the client messages of the mechanisms the
//! Kafka listener accepts, parsed down to the token they carry.
//!
//! Decides what a well-formed exchange is, in pure logic a fuzzer can drive: `PLAIN`
//! (RFC 4616, `authzid NUL authcid NUL passwd`; the password is the token, the names are
//! ignored) and `OAUTHBEARER` (RFC 7628's client first message, `gs2-header 0x01
//! *(key=value 0x01) 0x01`; the `auth` pair's `Bearer` credential is the token). The
//! invariant: any input gives a token slice or a typed [`SaslError`], never a panic, and
//! the error text never echoes the credential.

/// Largest SASL message accepted: a token and a little framing.
pub const MAX_SASL_MESSAGE: usize = super::MAX_TOKEN_LEN + 1024;

/// A SASL mechanism the Kafka listener speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaslMechanism {
    /// RFC 4616: the password is a Felix token.
    Plain,
    /// RFC 7628: the bearer token is a Felix token.
    OAuthBearer,
}

impl SaslMechanism {
    /// Every mechanism, as a SaslHandshake answer lists them.
    pub const ALL: [SaslMechanism; 2] = [SaslMechanism::Plain, SaslMechanism::OAuthBearer];

    /// The IANA name clients ask for.
    pub fn as_str(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::OAuthBearer => "OAUTHBEARER",
        }
    }

    /// Parses a mechanism name (exact, as SASL names are case-sensitive upper case).
    pub fn parse(name: &str) -> Option<SaslMechanism> {
        SaslMechanism::ALL.into_iter().find(|m| m.as_str() == name)
    }

    /// The token a client message of this mechanism carries.
    pub fn token(self, message: &[u8]) -> Result<&str, SaslError> {
        match self {
            SaslMechanism::Plain => plain_token(message),
            SaslMechanism::OAuthBearer => oauthbearer_token(message),
        }
    }
}

/// Why a SASL client message was refused. The text names the rule broken, never the bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SaslError {
    #[error("the SASL message is {0} bytes; the limit is {MAX_SASL_MESSAGE}")]
    TooLong(usize),
    #[error("the SASL message is not UTF-8")]
    NotUtf8,
    #[error("a PLAIN message is authzid NUL username NUL password (RFC 4616)")]
    PlainShape,
    #[error("the PLAIN password is empty: it must be a Felix token")]
    EmptyPassword,
    #[error(
        "an OAUTHBEARER message is gs2-header 0x01 key=value 0x01 ... 0x01 (RFC 7628 client first message)"
    )]
    OAuthShape,
    #[error("the OAUTHBEARER gs2 header must be n,[a=authzid], (channel binding is not supported)")]
    Gs2Header,
    #[error("the OAUTHBEARER message has no auth=Bearer <token> pair")]
    NoBearer,
}

fn text(message: &[u8]) -> Result<&str, SaslError> {
    if message.len() > MAX_SASL_MESSAGE {
        return Err(SaslError::TooLong(message.len()));
    }
    std::str::from_utf8(message).map_err(|_| SaslError::NotUtf8)
}

/// The password of a PLAIN message: `[authzid] NUL authcid NUL passwd`.
pub fn plain_token(message: &[u8]) -> Result<&str, SaslError> {
    let text = text(message)?;
    let mut parts = text.split('\0');
    let (Some(_authzid), Some(_authcid), Some(password), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(SaslError::PlainShape);
    };
    let password = password.trim();
    if password.is_empty() {
        return Err(SaslError::EmptyPassword);
    }
    Ok(password)
}

/// The bearer token of an OAUTHBEARER client first message.
pub fn oauthbearer_token(message: &[u8]) -> Result<&str, SaslError> {
    let text = text(message)?;
    let (gs2, rest) = text.split_once('\x01').ok_or(SaslError::OAuthShape)?;
    // gs2-header = gs2-cb-flag "," [ authzid ] "," ; only "n" (no channel binding) is
    // accepted: "y" and "p=" ask for binding this server does not offer.
    let mut gs2 = gs2.split(',');
    match (gs2.next(), gs2.next(), gs2.next(), gs2.next()) {
        (Some("n"), Some(authzid), Some(""), None)
            if authzid.is_empty() || authzid.starts_with("a=") => {}
        _ => return Err(SaslError::Gs2Header),
    }
    // Each pair ends with 0x01, and one more 0x01 ends the message.
    let pairs = rest.strip_suffix('\x01').ok_or(SaslError::OAuthShape)?;
    if !pairs.is_empty() && !pairs.ends_with('\x01') {
        return Err(SaslError::OAuthShape);
    }
    let mut bearer = None;
    for pair in pairs.split_terminator('\x01') {
        if pair.is_empty() {
            return Err(SaslError::OAuthShape);
        }
        let (key, value) = pair.split_once('=').ok_or(SaslError::OAuthShape)?;
        if key == "auth" {
            let (scheme, token) = value.split_once(' ').ok_or(SaslError::NoBearer)?;
            if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
                return Err(SaslError::NoBearer);
            }
            bearer = Some(token.trim());
        }
    }
    bearer.ok_or(SaslError::NoBearer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_gives_the_password_and_ignores_the_names() {
        assert_eq!(plain_token(b"\0user\0tok.en.sig"), Ok("tok.en.sig"));
        assert_eq!(plain_token(b"admin\0user\0t"), Ok("t"));
        assert_eq!(plain_token(b"user\0t"), Err(SaslError::PlainShape));
        assert_eq!(plain_token(b"\0u\0t\0x"), Err(SaslError::PlainShape));
        assert_eq!(plain_token(b"\0u\0"), Err(SaslError::EmptyPassword));
        assert_eq!(plain_token(&[0, b'u', 0, 0xff]), Err(SaslError::NotUtf8));
        let long = vec![b'a'; MAX_SASL_MESSAGE + 1];
        assert!(matches!(plain_token(&long), Err(SaslError::TooLong(_))));
    }

    #[test]
    fn oauthbearer_gives_the_bearer_token_of_a_client_first_message() {
        assert_eq!(
            oauthbearer_token(b"n,,\x01auth=Bearer abc.def.ghi\x01\x01"),
            Ok("abc.def.ghi")
        );
        // librdkafka's shape: an authzid and extensions.
        assert_eq!(
            oauthbearer_token(b"n,a=user,\x01host=x\x01auth=Bearer t\x01ext=1\x01\x01"),
            Ok("t")
        );
        assert_eq!(
            oauthbearer_token(b"y,,\x01auth=Bearer t\x01\x01"),
            Err(SaslError::Gs2Header)
        );
        assert_eq!(
            oauthbearer_token(b"n,,\x01auth=Basic t\x01\x01"),
            Err(SaslError::NoBearer)
        );
        assert_eq!(
            oauthbearer_token(b"n,,\x01host=x\x01\x01"),
            Err(SaslError::NoBearer)
        );
        assert_eq!(
            oauthbearer_token(b"n,,\x01auth=Bearer t\x01"),
            Err(SaslError::OAuthShape)
        );
        assert_eq!(oauthbearer_token(b"\x01"), Err(SaslError::Gs2Header));
        assert_eq!(oauthbearer_token(b""), Err(SaslError::OAuthShape));
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_give_a_token_or_a_typed_error(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)
        ) {
            for m in SaslMechanism::ALL {
                if let Ok(token) = m.token(&bytes) {
                    proptest::prop_assert!(!token.is_empty());
                }
            }
        }

        #[test]
        fn well_formed_messages_give_back_their_token(
            user in "[a-z]{0,8}",
            token in "[A-Za-z0-9._-]{1,64}",
        ) {
            let plain = format!("{user}\0{user}\0{token}");
            proptest::prop_assert_eq!(plain_token(plain.as_bytes()), Ok(token.as_str()));
            let authzid = if user.is_empty() { String::new() } else { format!("a={user}") };
            let oauth = format!("n,{authzid},\x01host=h\x01auth=Bearer {token}\x01\x01");
            proptest::prop_assert_eq!(oauthbearer_token(oauth.as_bytes()), Ok(token.as_str()));
        }
    }

    #[test]
    fn mechanisms_parse_by_their_exact_names() {
        assert_eq!(SaslMechanism::parse("PLAIN"), Some(SaslMechanism::Plain));
        assert_eq!(
            SaslMechanism::parse("OAUTHBEARER"),
            Some(SaslMechanism::OAuthBearer)
        );
        assert_eq!(SaslMechanism::parse("plain"), None);
        assert_eq!(SaslMechanism::parse("SCRAM-SHA-256"), None);
    }
}
