//! An S3 client for `s3://` URLs: region, endpoint and path style from the configuration,
//! credentials from the standard AWS chain (environment, profile, web identity, ECS, IMDS)
//! through aws-config. Invariant: credentials are cached until shortly before they expire
//! and never appear in a store's description (which goes to logs).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use aws_credential_types::provider::SharedCredentialsProvider;
use object_store::aws::{AmazonS3Builder, AwsCredential};
use object_store::path::Path;
use object_store::{BackoffConfig, ClientOptions, CredentialProvider, ObjectStore, RetryConfig};

use super::{StoreConfig, StoreError};

/// Refresh expiring AWS credentials this long before they expire.
const CREDENTIAL_REFRESH_MARGIN: Duration = Duration::from_secs(300);

pub(super) async fn open_s3(
    cfg: &StoreConfig,
    bucket: &str,
    prefix: &Path,
    credentials: Option<SharedCredentialsProvider>,
) -> Result<(Arc<dyn ObjectStore>, String), StoreError> {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
    if let Some(region) = &cfg.s3_region {
        loader = loader.region(aws_config::Region::new(region.clone()));
    }
    if let Some(credentials) = credentials {
        loader = loader.credentials_provider(credentials);
    }
    let sdk = loader.load().await;
    let region = sdk
        .region()
        .map(|r| r.to_string())
        .unwrap_or_else(|| "us-east-1".to_string());
    let provider = sdk.credentials_provider().ok_or_else(|| {
        StoreError::Config("the AWS configuration has no credentials provider".into())
    })?;

    let mut client = ClientOptions::new()
        .with_timeout(cfg.op_timeout)
        .with_connect_timeout(cfg.connect_timeout);
    let mut builder = AmazonS3Builder::new()
        .with_bucket_name(bucket)
        .with_region(region.clone())
        .with_credentials(Arc::new(AwsChainCredentials::new(provider)))
        // The TierStore retries; object_store's client retries only a little, for what the
        // TierStore cannot retry (multipart parts, listing pages after the first).
        .with_retry(RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(50),
                max_backoff: Duration::from_millis(500),
                base: 2.0,
            },
            max_retries: 2,
            retry_timeout: cfg.op_timeout,
        });
    let mut description = if prefix.is_root() {
        format!("s3://{bucket}")
    } else {
        format!("s3://{bucket}/{prefix}")
    };
    let path_style = cfg.s3_path_style || cfg.s3_endpoint.is_some();
    match &cfg.s3_endpoint {
        Some(endpoint) => {
            let endpoint = endpoint.trim_end_matches('/');
            if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
                return Err(StoreError::Config(format!(
                    "S3 endpoint `{endpoint}` must start with http:// or https://"
                )));
            }
            client = client.with_allow_http(endpoint.starts_with("http://"));
            builder = builder.with_endpoint(endpoint);
            description.push_str(&format!(
                " (endpoint {}, region {region})",
                without_userinfo(endpoint)
            ));
        }
        None => description.push_str(&format!(" (region {region})")),
    }
    let store = builder
        .with_client_options(client)
        .with_virtual_hosted_style_request(!path_style)
        .build()
        .map_err(|e| StoreError::Config(format!("{description}: {e}")))?;
    Ok((Arc::new(store), description))
}

/// `endpoint` without any `user:password@` (descriptions go to logs).
fn without_userinfo(endpoint: &str) -> String {
    match endpoint.split_once("://") {
        Some((scheme, rest)) => {
            let authority_end = rest.find('/').unwrap_or(rest.len());
            match rest[..authority_end].rfind('@') {
                Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
                None => endpoint.to_string(),
            }
        }
        None => endpoint.to_string(),
    }
}

/// aws-config's credential chain as object_store's credential source. object_store asks for
/// credentials on every request, so they are cached until shortly before they expire.
#[derive(Debug)]
struct AwsChainCredentials {
    provider: SharedCredentialsProvider,
    cached: tokio::sync::Mutex<Option<(Arc<AwsCredential>, Option<SystemTime>)>>,
}

impl AwsChainCredentials {
    fn new(provider: SharedCredentialsProvider) -> Self {
        AwsChainCredentials {
            provider,
            cached: tokio::sync::Mutex::new(None),
        }
    }
}

#[async_trait]
impl CredentialProvider for AwsChainCredentials {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        use aws_credential_types::provider::ProvideCredentials;
        use aws_credential_types::provider::error::CredentialsError;

        let mut cached = self.cached.lock().await;
        let now = SystemTime::now();
        if let Some((credential, expiry)) = &*cached
            && expiry.is_none_or(|t| t > now + CREDENTIAL_REFRESH_MARGIN)
        {
            return Ok(credential.clone());
        }
        match self.provider.provide_credentials().await {
            Ok(c) => {
                let credential = Arc::new(AwsCredential {
                    key_id: c.access_key_id().to_string(),
                    secret_key: c.secret_access_key().to_string(),
                    token: c.session_token().map(str::to_string),
                });
                *cached = Some((credential.clone(), c.expiry()));
                Ok(credential)
            }
            // A refresh failed but the old credentials are still good: use them.
            Err(_)
                if cached
                    .as_ref()
                    .is_some_and(|(_, e)| e.is_some_and(|t| t > now)) =>
            {
                Ok(cached
                    .as_ref()
                    .map(|(c, _)| c.clone())
                    .expect("checked above"))
            }
            Err(e) => {
                let permanent = matches!(
                    e,
                    CredentialsError::CredentialsNotLoaded(_)
                        | CredentialsError::InvalidConfiguration(_)
                );
                let source = Box::new(e);
                Err(if permanent {
                    object_store::Error::Unauthenticated {
                        path: String::new(),
                        source,
                    }
                } else {
                    object_store::Error::Generic {
                        store: "S3 credentials",
                        source,
                    }
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptions_drop_endpoint_userinfo() {
        assert_eq!(
            without_userinfo("http://user:pw@127.0.0.1:8333/x"),
            "http://127.0.0.1:8333/x"
        );
        assert_eq!(
            without_userinfo("http://127.0.0.1:8333"),
            "http://127.0.0.1:8333"
        );
    }
}
