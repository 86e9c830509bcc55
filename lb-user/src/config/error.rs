//! Configuration errors: where (file, service or zone, TOML field path) and what is allowed,
//! and the collector the checks report them to (all problems at once, up to a bound).

use std::fmt;
use std::path::PathBuf;

/// The object a violation belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The configuration as a whole (the count of problems not listed).
    Config,
    /// `[dataplane]`.
    Dataplane,
    /// `[announce]` (fields are absolute, like `[dataplane]`'s).
    Announce,
    /// `[dns]` (fields are absolute).
    Dns,
    /// `[resolver]` (fields are absolute).
    Resolver,
    /// The `index`-th `[[zone]]`.
    Zone { index: usize, name: String },
    /// The `index`-th `[[service]]`.
    Service { index: usize, name: String },
    /// The `index`-th `[[latency]]` (Traffic Manager PERFORMANCE input).
    Latency { index: usize },
    /// The `index`-th `[[geo]]` (Traffic Manager GEOGRAPHIC input).
    Geo { index: usize },
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // An empty name cannot identify the object, so fall back to its position in the file.
        match self {
            Scope::Config => f.write_str("configuration"),
            Scope::Dataplane => f.write_str("dataplane"),
            Scope::Announce => f.write_str("announce"),
            Scope::Dns => f.write_str("dns"),
            Scope::Resolver => f.write_str("resolver"),
            Scope::Zone { index, name } if name.is_empty() => write!(f, "zone[{index}]"),
            Scope::Zone { name, .. } => write!(f, "zone {name:?}"),
            Scope::Service { index, name } if name.is_empty() => write!(f, "service[{index}]"),
            Scope::Service { name, .. } => write!(f, "service {name:?}"),
            Scope::Latency { index } => write!(f, "latency[{index}]"),
            Scope::Geo { index } => write!(f, "geo[{index}]"),
        }
    }
}

/// One broken rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub scope: Scope,
    /// TOML path of the offending field, relative to the scope's table
    /// (e.g. `zonal_affinity.spillover_ratio`, `backend[3].zone`); absolute for `dataplane.*`.
    pub field: String,
    /// What is wrong and what is allowed.
    pub problem: String,
}

impl Violation {
    /// The service name, if the violation belongs to a service.
    pub fn service(&self) -> Option<&str> {
        match &self.scope {
            Scope::Service { name, .. } => Some(name),
            _ => None,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.scope {
            Scope::Config => f.write_str(&self.problem),
            Scope::Dataplane | Scope::Announce | Scope::Dns | Scope::Resolver => {
                write!(f, "{}: {}", self.field, self.problem)
            }
            _ => write!(f, "{}: {}: {}", self.scope, self.field, self.problem),
        }
    }
}

#[derive(Debug)]
pub enum ConfigErrorKind {
    Read(std::io::Error),
    /// TOML syntax, unknown keys, unknown enum values, wrong types (toml shows the line): every
    /// one found, in file order, each with its field path (found by `recover`).
    Syntax(Vec<SyntaxError>),
    /// Parsed, but breaks the rules of the contract.
    Invalid(Vec<Violation>),
}

/// Errors listed, at most (the count says how many more were found).
pub const MAX_LISTED: usize = 100;

/// A syntax or type error, with the TOML path of the field it is in (e.g.
/// `service[1].backend[0].weight`; empty when the error is not inside a table).
#[derive(Debug)]
pub struct SyntaxError {
    pub field: String,
    /// 1-based, in the file.
    pub line: usize,
    pub column: usize,
    pub message: String,
    /// The deserializer's own report (with the line quoted) for the file's first error.
    pub(super) detail: Option<toml::de::Error>,
}

impl SyntaxError {
    /// One line: field path, line, column, message (for a list of several).
    pub fn short(&self) -> String {
        let at = format!("line {}, column {}: {}", self.line, self.column, self.message.trim().replace('\n', "; "));
        if self.field.is_empty() {
            at
        } else {
            format!("{}: {at}", self.field)
        }
    }
}

/// The deserializer's report (quoting the line) where there is one, else [`SyntaxError::short`].
impl std::fmt::Display for SyntaxError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.detail {
            Some(e) if self.field.is_empty() => write!(f, "{e}"),
            Some(e) => write!(f, "{}: {e}", self.field),
            None => f.write_str(&self.short()),
        }
    }
}

#[derive(Debug)]
pub struct ConfigError {
    /// The file, when loaded from one.
    pub file: Option<PathBuf>,
    pub kind: ConfigErrorKind,
}

impl ConfigError {
    /// The contract violations (empty for read and syntax errors).
    pub fn violations(&self) -> &[Violation] {
        match &self.kind {
            ConfigErrorKind::Invalid(v) => v,
            _ => &[],
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{}: ", file.display())?;
        }
        match &self.kind {
            ConfigErrorKind::Read(e) => write!(f, "cannot read configuration: {e}"),
            ConfigErrorKind::Syntax(e) if e.len() == 1 => write!(f, "invalid configuration: {}", e[0]),
            ConfigErrorKind::Syntax(e) => {
                write!(f, "invalid configuration ({} syntax or type problems):", e.len())?;
                for problem in e.iter().take(MAX_LISTED) {
                    write!(f, "\n  - {}", problem.short())?;
                }
                if e.len() > MAX_LISTED {
                    write!(f, "\n  ... and {} more", e.len() - MAX_LISTED)?;
                }
                Ok(())
            }
            ConfigErrorKind::Invalid(v) if v.len() == 1 => {
                write!(f, "invalid configuration: {}", v[0])
            }
            ConfigErrorKind::Invalid(v) => {
                write!(f, "invalid configuration ({} problems):", v.len())?;
                for violation in v {
                    write!(f, "\n  - {violation}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for ConfigError {
    // No source: the message already carries the read/TOML error, and `{:#}` would print it twice.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ConfigErrorKind::Read(_) | ConfigErrorKind::Syntax(_) | ConfigErrorKind::Invalid(_) => None,
        }
    }
}

/// At most this many violations are listed; the rest are counted in one closing line. A file
/// with thousands of copies of one mistake gets a readable answer in bounded memory.
pub const MAX_VIOLATIONS: usize = 100;

/// Where the checks put their violations: the first `MAX_VIOLATIONS` are kept, the others only
/// counted.
#[derive(Default)]
pub(super) struct Sink {
    kept: Vec<Violation>,
    omitted: usize,
}

impl Sink {
    pub(super) fn push(&mut self, v: Violation) {
        if self.kept.len() < MAX_VIOLATIONS {
            self.kept.push(v);
        } else {
            self.omitted += 1;
        }
    }

    /// True once nothing more is kept: a check may skip building further messages.
    pub(super) fn is_full(&self) -> bool {
        self.kept.len() >= MAX_VIOLATIONS
    }

    pub(super) fn finish(mut self) -> Vec<Violation> {
        if self.omitted > 0 {
            self.kept.push(Violation {
                scope: Scope::Config,
                field: String::new(),
                problem: format!(
                    "{} more problems not listed (only the first {MAX_VIOLATIONS} are): fix these and \
                     validate again",
                    self.omitted
                ),
            });
        }
        self.kept
    }
}

/// Collects violations for one scope.
pub(super) struct Report<'a> {
    pub(super) out: &'a mut Sink,
    pub(super) scope: Scope,
}

impl Report<'_> {
    pub(super) fn push(&mut self, field: impl Into<String>, problem: impl Into<String>) {
        self.out.push(Violation { scope: self.scope.clone(), field: field.into(), problem: problem.into() });
    }
}
