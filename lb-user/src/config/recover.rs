//! Every syntax and type error of a configuration file at once. The TOML deserializer stops at
//! the first error; after one, each table of the file is parsed again on its own (a top-level
//! table alone, then each of its sub-tables, e.g. each `[[service.backend]]`, under the
//! top-level table's header line), and the distinct errors are reported in file order, each with
//! its line, column and field path. Every part is parsed once and the parts are bounded in
//! number, so the work stays linear in the file's size whatever the file holds.

use super::error::{ConfigError, ConfigErrorKind, SyntaxError, MAX_LISTED};
use super::raw::Config;

/// Parts parsed again after a first error, at most: a hostile file with a million tables costs
/// no more than this many small parses.
const MAX_PARTS: usize = 4096;
/// A table header line: its line number (0-based) and the path.
struct Header {
    line: usize,
    path: Vec<String>,
}

/// The errors of `text`, `first` (the whole file's) among them, in file order.
pub fn all_errors(text: &str, first: toml::de::Error) -> Vec<SyntaxError> {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let headers: Vec<Header> =
        lines.iter().enumerate().filter_map(|(i, l)| header(l).map(|path| Header { line: i, path })).collect();
    let end_of = |h: usize| headers.get(h + 1).map_or(lines.len(), |n| n.line);
    let text_of = |from: usize, to: usize| lines[from..to].concat();
    // (document, its first line's number in the file, whether it is a sub-table's part).
    let mut parts: Vec<(String, usize, bool)> = Vec::new();
    // Keys before the first table.
    parts.push((text_of(0, headers.first().map_or(lines.len(), |h| h.line)), 0, false));
    let mut h = 0;
    while h < headers.len() && parts.len() < MAX_PARTS {
        // A top-level table alone, then each sub-table that follows it (same first key, longer
        // path) under the top-level table's header line. Without its fields the top-level table
        // may miss required ones, reported at its header line: its own part reports those.
        let head = &headers[h];
        parts.push((text_of(head.line, end_of(h)), head.line, false));
        let mut s = h + 1;
        while s < headers.len() && headers[s].path.len() > 1 && headers[s].path[0] == head.path[0] {
            if parts.len() < MAX_PARTS {
                // The header line alone, then the sub-table: the sub-table starts one line down.
                let doc =
                    lines[head.line].trim_end_matches('\n').to_owned() + "\n" + &text_of(headers[s].line, end_of(s));
                parts.push((doc, headers[s].line - 1, true));
            }
            s += 1;
        }
        h = s;
    }
    let mut found = vec![located(text, 0, &first)];
    found[0].detail = Some(first);
    for (doc, offset, sub) in parts {
        if let Err(e) = toml::from_str::<Config>(&doc) {
            let error = located(&doc, offset, &e);
            // A sub-table's part starts with its top-level table's header line (file line
            // `offset` here): an error there is the top-level table's own part's to report.
            if sub && error.line - 1 == offset {
                continue;
            }
            if !found.iter().any(|x| x.line == error.line && x.message == error.message) {
                found.push(error);
            }
        }
    }
    found.sort_by_key(|e| (e.line, e.column));
    for e in found.iter_mut().take(MAX_LISTED) {
        e.field = field_path(&lines, &headers, e.line - 1);
    }
    found
}

/// `e` of a part whose first line is line `offset` (0-based) of the file.
fn located(doc: &str, offset: usize, e: &toml::de::Error) -> SyntaxError {
    let at = e.span().map_or(0, |s| s.start.min(doc.len()));
    let before = &doc[..at];
    let line = before.matches('\n').count();
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    SyntaxError { field: String::new(), line: offset + line + 1, column, message: e.message().to_owned(), detail: None }
}

/// The path of a `[table]` or `[[array.of.tables]]` header line; None for any other line.
fn header(line: &str) -> Option<Vec<String>> {
    let l = line.trim();
    let l = l.split_once('#').map_or(l, |(h, _)| h).trim_end();
    let inner =
        l.strip_prefix("[[").and_then(|r| r.strip_suffix("]]")).or_else(|| l.strip_prefix('[')?.strip_suffix(']'))?;
    let path: Vec<String> = inner.split('.').map(|p| p.trim().trim_matches('"').to_owned()).collect();
    path.iter()
        .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        .then_some(path)
}

/// The field path of the line an error points at: the enclosing table's path, with the index of
/// each array-of-tables element, and the key on that line.
fn field_path(lines: &[&str], headers: &[Header], line: usize) -> String {
    let key = lines
        .get(line)
        .and_then(|l| l.split_once('='))
        .map(|(k, _)| k.trim().trim_matches('"').to_owned())
        .filter(|k| !k.is_empty() && !k.starts_with('['));
    let Some(at) = headers.partition_point(|h| h.line <= line).checked_sub(1) else { return key.unwrap_or_default() };
    // Index of each path element: how many headers of the same path came before since the
    // parent's own header (arrays of tables only, `[[...]]`).
    let mut parts = Vec::new();
    for depth in 1..=headers[at].path.len() {
        let prefix = &headers[at].path[..depth];
        let parent_start = if depth == 1 {
            0
        } else {
            headers[..=at].iter().rposition(|h| h.path == headers[at].path[..depth - 1]).map_or(0, |i| i + 1)
        };
        let name = &prefix[depth - 1];
        let is_array = headers[..=at]
            .iter()
            .rev()
            .find(|h| h.path == prefix)
            .is_some_and(|h| lines[h.line].trim_start().starts_with("[["));
        if is_array {
            let index = headers[parent_start..=at].iter().filter(|h| h.path == prefix).count().saturating_sub(1);
            parts.push(format!("{name}[{index}]"));
        } else {
            parts.push(name.clone());
        }
    }
    if headers[at].line != line {
        parts.extend(key);
    }
    parts.join(".")
}

/// Reading a file's text into the serde structs (here, beside the recovery that lists every
/// syntax error).
impl Config {
    /// The file's text as written, its syntax checked (every syntax error listed), its rules
    /// not: see [`Config::validate`]. `super::Config::parse` does both and converts.
    pub fn read(text: &str) -> anyhow::Result<Config> {
        Self::read_text(text).map_err(|kind| ConfigError { file: None, kind }.into())
    }

    pub(super) fn read_text(text: &str) -> Result<Config, ConfigErrorKind> {
        toml::from_str(text).map_err(|first| ConfigErrorKind::Syntax(all_errors(text, first)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(text: &str) -> Vec<SyntaxError> {
        let first = toml::from_str::<Config>(text).unwrap_err();
        all_errors(text, first)
    }

    #[test]
    fn an_error_in_each_table_is_reported_with_its_line_and_path() {
        let text = "[dataplane]\nmaglev_table_size = \"big\"\n\n\
                    [[service]]\nname = \"web\"\nports = \"80\"\n\
                    [[service.backend]]\naddress = \"198.18.11.1\"\n\
                    [[service.backend]]\naddress = \"198.18.11.2\"\nweight = -\n\
                    [[service]]\nname = \"db\"\nsession_afinity = \"NONE\"\n";
        let found = errors(text);
        let fields: Vec<&str> = found.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "dataplane.maglev_table_size",
                "service[0].ports",
                "service[0].backend[1].weight",
                "service[1].session_afinity"
            ],
            "{found:#?}"
        );
        let lines: Vec<String> = found.iter().map(|e| e.to_string()).collect();
        for (e, line) in lines.iter().zip([2, 6, 11, 14]) {
            assert!(e.contains(&format!("line {line},")), "{e}");
        }
        assert!(lines[3].contains("unknown field `session_afinity`"), "{}", lines[3]);
    }

    #[test]
    fn a_table_missing_a_field_is_reported_once_with_its_sub_tables_errors() {
        // The service lacks its name: its own part says so (at its header line), the parts of
        // its backends do not repeat it and report their own errors.
        let text = "[[service]]\nvip = \"198.18.0.1\"\nprotocol = \"TCP\"\n\
                    [[service.backend]]\nweight = \"heavy\"\n[[service.backend]]\naddres = \"198.18.1.1\"\n";
        let found = errors(text);
        let fields: Vec<&str> = found.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            ["service[0]", "service[0].backend[0].weight", "service[0].backend[1].addres"],
            "{found:#?}"
        );
        assert!(found[0].to_string().contains("missing field `name`"), "{}", found[0]);
    }

    #[test]
    fn one_error_stays_one() {
        let found = errors("[[zone]]\nname = \"a\"\nclient_prefixes = 7\n");
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].field, "zone[0].client_prefixes");
    }

    #[test]
    fn an_error_only_the_whole_file_shows_is_kept() {
        // A table defined twice is valid in each part alone.
        let found = errors("[dataplane]\nmaglev_table_size = 1021\n[dataplane]\nmaglev_table_size = 1021\n");
        assert_eq!(found.len(), 1, "{found:#?}");
    }
}
