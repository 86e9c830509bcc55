//! docs/config.md, the configuration reference, read as data: its key entries (for the check
//! against the JSON Schema in tests/config_reference.rs) and its conversion to the man page
//! lb.toml(5) (`docs/lb.toml.5`).
//!
//! The page uses a small subset of Markdown, which this reader insists on: `#`, `##`, `###`
//! headings (a section's heading names its TOML table in backticks, e.g. `` `[service.monitor]` ``),
//! paragraphs, `- ` lists and key tables of six columns (key, type, default, allowed, used by,
//! meaning).

use anyhow::{bail, Result};

/// One documented key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The key's path from the file's root, tables joined by '.': `service.backend.mac`.
    pub path: String,
    pub ty: String,
    pub default: String,
    pub allowed: String,
    pub used_by: String,
    pub meaning: String,
}

/// The service kinds a key may be used by (the "used by" column).
pub const USED_BY: [&str; 3] = ["zonal", "Traffic Manager", "both"];

/// The header every key table starts with.
const TABLE_HEADER: &str = "| key | type | default | allowed | used by | meaning |";

/// The TOML table a section heading names: `## `[[service.backend]]`` -> `service.backend`.
fn heading_table(line: &str) -> Option<String> {
    let code = line.split('`').nth(1)?;
    let inner = code.strip_prefix('[')?.trim_start_matches('[');
    Some(inner.trim_end_matches(']').to_owned())
}

fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    inner.split(" | ").map(|c| c.trim().to_owned()).collect()
}

/// The table paths of the section headings and every key entry, in page order.
pub fn parse(markdown: &str) -> Result<(Vec<String>, Vec<Entry>)> {
    let mut tables = Vec::new();
    let mut entries = Vec::new();
    let mut table: Option<String> = None;
    for (n, line) in markdown.lines().enumerate() {
        if line.starts_with("## ") || line.starts_with("### ") {
            table = heading_table(line);
            match &table {
                Some(t) => tables.push(t.clone()),
                None => bail!("line {}: a section heading must name its table in backticks: {line}", n + 1),
            }
        } else if line.starts_with('|') && line != TABLE_HEADER && !line.starts_with("|---") {
            let c = cells(line);
            let Some(t) = &table else { bail!("line {}: a key table outside a section", n + 1) };
            if c.len() != 6 {
                bail!("line {}: {} cells, expected 6 ({TABLE_HEADER}): {line}", n + 1, c.len());
            }
            let Some(key) = c[0].strip_prefix('`').and_then(|k| k.strip_suffix('`')) else {
                bail!("line {}: the key must be in backticks: {}", n + 1, c[0]);
            };
            entries.push(Entry {
                path: format!("{t}.{key}"),
                ty: c[1].clone(),
                default: c[2].clone(),
                allowed: c[3].clone(),
                used_by: c[4].clone(),
                meaning: c[5].clone(),
            });
        }
    }
    Ok((tables, entries))
}

/// Text for roff: backslashes and hyphens escaped, `code` in bold.
fn inline(text: &str) -> String {
    let escaped = text.replace('\\', "\\e").replace('-', "\\-");
    let mut out = String::new();
    for (i, part) in escaped.split('`').enumerate() {
        if i % 2 == 1 {
            out += &format!("\\fB{part}\\fR");
        } else {
            out += part;
        }
    }
    out
}

/// A text line for roff: one starting with '.' or '\'' would be read as a request.
fn text_line(text: &str) -> String {
    let line = inline(text);
    if line.starts_with('.') || line.starts_with('\'') {
        format!("\\&{line}")
    } else {
        line
    }
}

/// lb.toml(5) from the page: `#` is the title (NAME), `##` sections, `###` subsections, key
/// tables a tagged paragraph per key.
pub fn man_page(markdown: &str) -> Result<String> {
    let mut out = String::from(
        ".\\\" Generated from docs/config.md by lb-tests' config_doc::man_page (LB_BLESS=1 cargo test -p lb-tests --test config_reference); do not edit.\n\
         .TH LB.TOML 5 \"\" \"lb\" \"File Formats\"\n\
         .SH NAME\n\
         lb.toml \\- configuration file of the lb load balancer\n\
         .SH DESCRIPTION\n",
    );
    let mut lines = markdown.lines().peekable();
    let mut paragraph_open = false;
    while let Some(line) = lines.next() {
        // The title: the NAME section says it.
        if line.starts_with("# ") {
            continue;
        }
        if line.trim().is_empty() {
            paragraph_open = false;
            continue;
        }
        if let Some(h) = line.strip_prefix("## ") {
            out += &format!(".SH \"{}\"\n", h.replace('`', ""));
            paragraph_open = false;
        } else if let Some(h) = line.strip_prefix("### ") {
            out += &format!(".SS \"{}\"\n", h.replace('`', ""));
            paragraph_open = false;
        } else if line == TABLE_HEADER || line.starts_with("|---") {
            continue;
        } else if line.starts_with('|') {
            let c = cells(line);
            if c.len() != 6 {
                bail!("a key row of {} cells, expected 6: {line}", c.len());
            }
            out += &format!(
                ".TP\n{}\n{} (default: {}; allowed: {}; used by: {})\n.br\n{}\n",
                text_line(&c[0]),
                text_line(&c[1]),
                inline(&c[2]),
                inline(&c[3]),
                inline(&c[4]),
                inline(&c[5])
            );
            paragraph_open = false;
        } else if let Some(item) = line.strip_prefix("- ") {
            out += &format!(".IP \\(bu 2\n{}\n", text_line(item));
            // Continuation lines are indented.
            while let Some(next) = lines.peek() {
                if next.starts_with("  ") {
                    out += &format!("{}\n", text_line(next.trim()));
                    lines.next();
                } else {
                    break;
                }
            }
            paragraph_open = false;
        } else {
            if !paragraph_open {
                out += ".PP\n";
                paragraph_open = true;
            }
            out += &format!("{}\n", text_line(line));
        }
    }
    out += ".SH SEE ALSO\n\\fBlb\\fR(8)\n";
    Ok(out)
}
