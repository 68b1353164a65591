//! Errors: `KnowledgeError` for loading data files (always names the file and the field) and
//! for a hardware profile asked for by a name none has;
//! `TemplateError` for knob sets that a template family rejects.

use std::path::PathBuf;

/// A data file under `knowledge/` or a task's `templates/` could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum KnowledgeError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: invalid TOML: {source}")]
    Toml {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("{path}: `{field}`: {message}")]
    Invalid {
        path: PathBuf,
        field: String,
        message: String,
    },
    /// As `Invalid`, where the line of the offending table is known.
    #[error("{path}:{line}: `{field}`: {message}")]
    InvalidAt {
        path: PathBuf,
        line: usize,
        field: String,
        message: String,
    },
    #[error("{path}: template error: {}", describe_jinja(source))]
    Template {
        path: PathBuf,
        source: Box<minijinja::Error>,
    },
    #[error(transparent)]
    Asset(#[from] ksearch_assets::AssetError),
    /// A hardware profile asked for by name that `knowledge/hardware` does not have.
    #[error("no hardware profile `{0}` in knowledge/hardware")]
    UnknownHardware(String),
    /// A code target asked for by name that the packs do not have; `known` lists theirs.
    #[error("no target `{name}` (targets: {known})")]
    UnknownTarget { name: String, known: String },
    #[error("no knowledge-pack target serves backend {0}")]
    NoTargetForBackend(String),
}

impl KnowledgeError {
    pub(crate) fn invalid(
        path: impl Into<PathBuf>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        KnowledgeError::Invalid {
            path: path.into(),
            field: field.into(),
            message: message.into(),
        }
    }
}

/// A knob set that a template family cannot render.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("family `{family}` has no knob `{knob}` (knobs: {known})")]
    UnknownKnob {
        family: String,
        knob: String,
        known: String,
    },
    #[error("family `{family}`: knob `{knob}` = {value} is outside its domain [{domain}]")]
    OutOfDomain {
        family: String,
        knob: String,
        value: String,
        domain: String,
    },
    #[error("family `{family}`: {message} (violated: {rule}; knobs: {knobs})")]
    Constraint {
        family: String,
        message: String,
        rule: String,
        knobs: String,
    },
    #[error("family `{family}` does not render for target `{target}` (targets: {known})")]
    UnknownTarget {
        family: String,
        target: String,
        known: String,
    },
    #[error("family `{family}`: expected KNOB=VALUE, got {text:?}")]
    Setting { family: String, text: String },
    #[error("family `{family}`: no valid combination keeps {fixed}")]
    Unsatisfiable { family: String, fixed: String },
    #[error(
        "family `{family}`: rendering {file} failed: {}",
        describe_jinja(source)
    )]
    Render {
        family: String,
        file: String,
        source: Box<minijinja::Error>,
    },
}

/// A minijinja error with its causes: an error inside an included template is only named by
/// the outer error, the reason sits in its source. `{:#}` adds the template excerpt.
fn describe_jinja(e: &minijinja::Error) -> String {
    let mut text = format!("{e:#}");
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        match c.downcast_ref::<minijinja::Error>() {
            Some(j) => text.push_str(&format!("\ncaused by: {j:#}")),
            None => text.push_str(&format!("\ncaused by: {c}")),
        }
        cause = c.source();
    }
    text
}
