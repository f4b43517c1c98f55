//! Reading one source into an [`Args`] layer: the TOML file, the `FELIX_*` environment and
//! the command line.
//!
//! The environment variable of each setting is declared with its flag (clap's `env`), but
//! clap does not read it: the environment is read here, through a lookup function (so tests
//! need not change the process environment), with a value trimmed, an empty value counting
//! as unset, and a bad value refused naming its variable. Invariant: a layer holds only
//! what its source set, so layers can be stacked in precedence order.

use std::path::Path;

use clap::{Arg, Command, FromArgMatches};

use super::{Args, ConfigError};

impl Args {
    /// The TOML file's layer.
    pub(super) fn from_file(path: &Path) -> Result<Args, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Args::from_toml(&text).map_err(|message| ConfigError::File {
            path: path.to_path_buf(),
            message,
        })
    }

    fn from_toml(text: &str) -> Result<Args, String> {
        let message = |e: toml::de::Error| e.to_string().trim_end().to_owned();
        // The spec's example keys this design has no use for are accepted (and noted at
        // start); without them the text is parsed as is, so errors keep their positions.
        let mut table: toml::Table = toml::from_str(text).map_err(message)?;
        if crate::inert_settings::strip(&mut table).is_empty() {
            return toml::from_str(text).map_err(message);
        }
        table.try_into().map_err(message)
    }

    /// The environment's layer. `lookup` returns a variable's value; an empty value counts
    /// as unset, so `FELIX_X=` cannot silently zero a setting. A value is parsed exactly as
    /// its flag's would be.
    pub(super) fn from_env(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Args, ConfigError> {
        let flags = without_env(flags_command());
        let mut layer = Args::default();
        for (var, long) in env_vars() {
            let Some(value) = lookup(&var) else { continue };
            if value.trim().is_empty() {
                continue;
            }
            let argv = ["felix".to_owned(), format!("--{long}={}", value.trim())];
            let parsed = flags
                .clone()
                .try_get_matches_from(argv)
                .and_then(|matches| Args::from_arg_matches(&matches));
            match parsed {
                Ok(one) => layer = layer.overlaid_with(one),
                Err(e) => {
                    let message = match std::error::Error::source(&e) {
                        Some(cause) => cause.to_string(),
                        None => e.kind().to_string(),
                    };
                    return Err(ConfigError::Env {
                        var,
                        value,
                        message,
                    });
                }
            }
        }
        Ok(layer)
    }
}

/// The flags of every setting (and `--config`), as clap declares them.
fn flags_command() -> Command {
    <Args as clap::Args>::augment_args(Command::new("felix"))
}

/// Each flag's environment variable and its long name.
fn env_vars() -> Vec<(String, String)> {
    let command = flags_command();
    command
        .get_arguments()
        .filter_map(|arg| {
            let var = arg.get_env()?.to_string_lossy().into_owned();
            Some((var, arg.get_long()?.to_owned()))
        })
        .collect()
}

/// The environment variable a setting is read from, if it has one.
pub(super) fn env_var_of(key: &str) -> Option<String> {
    let command = flags_command();
    let arg = command.get_arguments().find(|arg| arg.get_id() == key)?;
    Some(arg.get_env()?.to_string_lossy().into_owned())
}

/// `command` parsing the command line only: the environment is a layer of its own, read by
/// [`Args::from_env`]. The help still names each flag's variable.
pub fn without_env(command: Command) -> Command {
    command.mut_args(|arg| {
        let Some(var) = arg.get_env().map(|v| v.to_string_lossy().into_owned()) else {
            return arg;
        };
        let note = format!("[env: {var}]");
        let help = arg.get_help().map(|h| format!("{h} {note}"));
        let long_help = arg.get_long_help().map(|h| format!("{h}\n\n{note}"));
        let arg: Arg = arg.env(None);
        let arg = match help {
            Some(help) => arg.help(help),
            None => arg.help(note),
        };
        match long_help {
            Some(long_help) => arg.long_help(long_help),
            None => arg,
        }
    })
}

/// Parses `1/0`, `true/false`, `yes/no`, `on/off` (case-insensitive).
pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(format!("{s:?} is not a boolean (expected 1/0/true/false)")),
    }
}
