//! `felixctl stream ...`: create, alter, describe, list and delete streams.

use anyhow::{Context, anyhow};
use felix_client::{Connection, StreamConfig, codes};

use crate::args::StreamCommand;
use crate::output::{describe_json, print_json, stream_json};

pub(crate) async fn stream_command(client: &Connection, cmd: StreamCommand) -> anyhow::Result<u8> {
    match cmd {
        StreamCommand::Create {
            path: (t, ns, s),
            durable,
            settings,
            if_not_exists,
        } => {
            let mut config = settings.config();
            // Explicit, so the stream is what felixctl says whatever the broker's default.
            config.durable = Some(durable);
            let info = match client.create_stream(&t, &ns, &s, config).await {
                Ok(info) => info,
                Err(e) if if_not_exists && e.code() == Some(codes::ALREADY_EXISTS) => client
                    .describe_stream(&t, &ns, &s)
                    .await
                    .with_context(|| format!("describing {t}/{ns}/{s}"))?,
                Err(e) => return Err(anyhow!(e).context(format!("creating stream {t}/{ns}/{s}"))),
            };
            print_json(&stream_json(&info)?)?;
        }
        StreamCommand::Alter {
            path: (t, ns, s),
            settings,
        } => {
            let config = settings.config();
            if config == StreamConfig::default() {
                eprintln!("felixctl: stream alter: no setting given (see --help)");
                return Ok(2);
            }
            let info = client
                .alter_stream(&t, &ns, &s, config)
                .await
                .with_context(|| format!("altering stream {t}/{ns}/{s}"))?;
            print_json(&stream_json(&info)?)?;
        }
        StreamCommand::Describe { path: (t, ns, s) } => {
            let info = client
                .describe_stream(&t, &ns, &s)
                .await
                .with_context(|| format!("describing stream {t}/{ns}/{s}"))?;
            print_json(&describe_json(&info)?)?;
        }
        StreamCommand::List { path: (t, ns) } => {
            let streams = client
                .list_streams(&t, &ns)
                .await
                .with_context(|| format!("listing streams of {t}/{ns}"))?;
            print_json(&stream_json(&streams)?)?;
        }
        StreamCommand::Delete { path: (t, ns, s) } => {
            client
                .delete_stream(&t, &ns, &s)
                .await
                .with_context(|| format!("deleting stream {t}/{ns}/{s}"))?;
            println!("deleted stream {t}/{ns}/{s}");
        }
    }
    Ok(0)
}
