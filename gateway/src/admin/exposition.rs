//! Which text `/metrics` answers in: content negotiation between OpenMetrics 1.0 (what the
//! registry writes) and the Prometheus text format 0.0.4 (what `promtool check metrics`,
//! older scrapers and many tools parse).
//!
//! The invariant: the two answers carry the same families, series and values; only the
//! framing differs. OpenMetrics names a counter's family without its `_total` (the samples
//! have it), ends with `# EOF`, may carry `# UNIT` lines, `info` families and exemplars; the
//! Prometheus text format names the family as its samples are named, has no EOF, units or
//! exemplars, and knows `untyped` where OpenMetrics says `unknown`. Converting the one text
//! into the other keeps a single registry (and a single encoder) as the source of truth.

/// The content type of the Prometheus text format.
pub const PROMETHEUS_TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The format a scrape asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposition {
    OpenMetrics,
    PrometheusText,
}

/// Chooses by the request's `Accept` header: the media type with the higher quality wins,
/// OpenMetrics on a tie and when neither is named (no header, `*/*`): the format `/metrics`
/// has always served. `text/plain` with another `version` than 0.0.4 is not ours to claim.
pub fn negotiate(accept: Option<&str>) -> Exposition {
    let Some(accept) = accept else {
        return Exposition::OpenMetrics;
    };
    let mut openmetrics = 0.0f32;
    let mut text = 0.0f32;
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or_default().to_ascii_lowercase();
        let mut quality = 1.0f32;
        let mut version = None;
        for param in parts {
            let Some((key, value)) = param.split_once('=') else {
                continue;
            };
            match key.trim().to_ascii_lowercase().as_str() {
                // A malformed quality is treated as absent, as browsers do.
                "q" => quality = value.trim().parse().unwrap_or(1.0),
                "version" => version = Some(value.trim().trim_matches('"').to_owned()),
                _ => {}
            }
        }
        match media.as_str() {
            "application/openmetrics-text" => openmetrics = openmetrics.max(quality),
            "text/plain" if version.as_deref().is_none_or(|v| v == "0.0.4") => {
                text = text.max(quality)
            }
            _ => {}
        }
    }
    if text > openmetrics {
        Exposition::PrometheusText
    } else {
        Exposition::OpenMetrics
    }
}

/// The Prometheus text format (0.0.4) of an OpenMetrics exposition.
pub fn prometheus_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // The family being written: its OpenMetrics name, its name in the text format, and
    // whether its samples named `<family>_created` are left out (counters: the text format
    // has no created timestamps, and `promtool` would take them for a family of their own).
    let mut help: Option<(String, String)> = None;
    let mut created_of: Option<String> = None;
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            // Held until the TYPE line says what the family is called in this format.
            help = Some((name.to_owned(), unescape_help(text)));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            let (exposed, kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "info" => (format!("{name}_info"), "gauge"),
                "gauge" | "histogram" | "summary" => (name.to_owned(), kind),
                _ => (name.to_owned(), "untyped"),
            };
            created_of = (kind == "counter").then(|| format!("{name}_created"));
            if let Some((help_name, text)) = help.take()
                && help_name == name
            {
                out.push_str(&format!("# HELP {exposed} {text}\n"));
            }
            out.push_str(&format!("# TYPE {exposed} {kind}\n"));
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        if created_of
            .as_deref()
            .is_some_and(|created| sample_name(line) == created)
        {
            continue;
        }
        out.push_str(without_exemplar(line));
        out.push('\n');
    }
    out
}

/// OpenMetrics escapes `"` in HELP text; the text format knows only `\\` and `\n` there and
/// refuses any other escape.
fn unescape_help(text: &str) -> String {
    text.replace("\\\"", "\"")
}

/// The metric name a sample line starts with.
fn sample_name(line: &str) -> &str {
    let end = line.find(['{', ' ']).unwrap_or(line.len());
    &line[..end]
}

/// A sample line without its exemplar (` # {...} value`), which the text format lacks. The
/// label set is skipped with its quoting, so a `#` inside a label value stays.
fn without_exemplar(line: &str) -> &str {
    let mut in_quotes = false;
    let mut escaped = false;
    let mut in_labels = false;
    for (i, c) in line.char_indices() {
        if in_quotes {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_quotes = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' if in_labels => in_quotes = true,
            '{' => in_labels = true,
            '}' => in_labels = false,
            '#' if !in_labels => return line[..i].trim_end(),
            _ => {}
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_asks_for_openmetrics_first_and_gets_it() {
        // Prometheus 2.42's scrape Accept header.
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                          version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(negotiate(Some(prometheus)), Exposition::OpenMetrics);
        assert_eq!(negotiate(None), Exposition::OpenMetrics);
        assert_eq!(negotiate(Some("*/*")), Exposition::OpenMetrics);
    }

    #[test]
    fn a_scraper_asking_for_the_text_format_gets_it() {
        assert_eq!(negotiate(Some("text/plain")), Exposition::PrometheusText);
        assert_eq!(
            negotiate(Some("text/plain;version=0.0.4;q=0.9, */*;q=0.1")),
            Exposition::PrometheusText
        );
        assert_eq!(
            negotiate(Some(
                "application/openmetrics-text;q=0.3, text/plain; version=0.0.4"
            )),
            Exposition::PrometheusText
        );
        // Not the text format we write.
        assert_eq!(
            negotiate(Some("text/plain;version=9.9")),
            Exposition::OpenMetrics
        );
    }

    #[test]
    fn counters_info_and_unknown_families_take_their_text_format_names() {
        let om = "# HELP felix_x Things \\\"done\\\".\n\
                  # TYPE felix_x counter\n\
                  # UNIT felix_x things\n\
                  felix_x_total{a=\"b # c\"} 3 # {trace=\"1\"} 1.0\n\
                  felix_x_created{a=\"b # c\"} 1700000000.0\n\
                  # HELP felix_build Build.\n\
                  # TYPE felix_build info\n\
                  felix_build_info{version=\"1\"} 1\n\
                  # TYPE felix_odd unknown\n\
                  felix_odd 2\n\
                  # HELP felix_d Latency.\n\
                  # TYPE felix_d histogram\n\
                  felix_d_bucket{le=\"+Inf\"} 1\n\
                  felix_d_sum 0.5\n\
                  felix_d_count 1\n\
                  # EOF\n";
        let text = prometheus_text(om);
        assert_eq!(
            text,
            "# HELP felix_x_total Things \"done\".\n\
             # TYPE felix_x_total counter\n\
             felix_x_total{a=\"b # c\"} 3\n\
             # HELP felix_build_info Build.\n\
             # TYPE felix_build_info gauge\n\
             felix_build_info{version=\"1\"} 1\n\
             # TYPE felix_odd untyped\n\
             felix_odd 2\n\
             # HELP felix_d Latency.\n\
             # TYPE felix_d histogram\n\
             felix_d_bucket{le=\"+Inf\"} 1\n\
             felix_d_sum 0.5\n\
             felix_d_count 1\n"
        );
    }
}
