//! A task's template family rendered for tools outside the binary (`ksearch tasks --render`,
//! docs/cli.md): one setting's source, every valid setting, the named settings of a variants
//! file, and a batch protocol (one JSON request per line in, one JSON reply per line out) so a
//! tool renders and checks many settings in one process. The Python tools under `gpu/` are
//! clients of this (`gpu/ksearch_render.py`); they neither render templates nor check knobs
//! themselves, so what they measure is what the search renders.

use crate::error::{KnowledgeError, TemplateError};
use crate::files::read_toml;
use crate::templates::{format_knobs, Knob, KnobValue, Knobs, Rule, TemplateFamily};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

/// What `ksearch tasks --render` prints.
#[derive(Debug, Clone, Copy)]
pub enum Job<'a> {
    /// The source of one setting (`KNOB=VALUE` items; the rest take their defaults).
    Source(&'a [String]),
    /// Every valid setting, one JSON [`Setting`] per line, without sources.
    All,
    /// The named settings of a variants file, one JSON [`Setting`] per line, without sources.
    Variants(&'a Path),
    /// A JSON reply per JSON request line read from the input (see [`Request`]).
    Batch,
}

impl<'a> Job<'a> {
    /// The job of `ksearch tasks --render`'s options: `--list [FILE]`, else `--batch`, else the
    /// source of the `--set` items.
    pub fn from_options(list: Option<Option<&'a Path>>, batch: bool, set: &'a [String]) -> Self {
        match (list, batch) {
            (Some(Some(file)), _) => Job::Variants(file),
            (Some(None), _) => Job::All,
            (None, true) => Job::Batch,
            (None, false) => Job::Source(set),
        }
    }
}

/// Why `ksearch tasks --render` could not do its job. Errors about one request of a batch are
/// replies, not errors.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("{} has no template family for backend `{backend}`", task.display())]
    NoFamily { task: PathBuf, backend: String },
    #[error(transparent)]
    Knowledge(#[from] KnowledgeError),
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error("cannot read the requests or write the replies: {0}")]
    Io(#[from] std::io::Error),
}

/// A complete, valid knob setting with the labels tools file results under.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Setting {
    /// The variant's name (variants files) or the request's (batch), echoed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub knobs: Knobs,
    /// See [`variant_id`].
    pub variant_id: String,
    /// `name=value …` sorted by name: what templates get as `knob_summary`.
    pub knob_summary: String,
    /// The rendered template, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

impl Setting {
    fn new(name: Option<String>, knobs: Knobs) -> Setting {
        Setting {
            name,
            variant_id: variant_id(&knobs),
            knob_summary: format_knobs(&knobs),
            knobs,
            source: None,
        }
    }
}

/// A stable id of a complete setting: the first 10 hex digits of the BLAKE3 hash of its JSON
/// (knobs sorted by name, no spaces). Equal settings get equal ids whatever order they were
/// written in; build outputs are filed under it.
pub fn variant_id(knobs: &Knobs) -> String {
    // A map of strings to plain values always serialises.
    let json = serde_json::to_string(knobs).unwrap_or_default();
    blake3::hash(json.as_bytes()).to_hex()[..10].to_string()
}

/// One line of a batch. Every field may be left out: `{}` is the defaults' source.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// Echoed in the reply, so a tool can match replies to what it asked.
    #[serde(default)]
    pub name: Option<String>,
    /// Knob overrides; the others take their defaults.
    #[serde(default)]
    pub knobs: Knobs,
    /// A template of the family other than its entry (e.g. shared device code).
    #[serde(default)]
    pub template: Option<String>,
    /// A code target other than the one the family was opened for.
    #[serde(default)]
    pub target: Option<String>,
    /// `false`: only check the setting and complete it (no source).
    #[serde(default = "yes")]
    pub source: bool,
    /// `true`: reply with the family's [`Description`] instead.
    #[serde(default)]
    pub describe: bool,
}

fn yes() -> bool {
    true
}

/// A family as tools see it: its knobs (domains, defaults) and rules.
#[derive(Debug, Serialize)]
pub struct Description<'a> {
    pub name: &'a str,
    pub description: &'a str,
    pub entry: &'a str,
    pub backends: &'a [String],
    pub targets: &'a [String],
    pub target: Option<&'a str>,
    pub knobs: &'a [Knob],
    pub rules: Vec<RuleText<'a>>,
    /// Combinations before constraints.
    pub space: u64,
}

/// A rule as text: a constraint's expression or a forbidden combination, and its message.
#[derive(Debug, Serialize)]
pub struct RuleText<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expr: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forbid: Option<&'a Knobs>,
    pub message: &'a str,
}

pub fn describe(family: &TemplateFamily) -> Description<'_> {
    Description {
        name: family.name(),
        description: family.description(),
        entry: family.entry(),
        backends: family.backends(),
        targets: family.targets(),
        target: family.target(),
        knobs: family.knobs(),
        rules: family
            .rules()
            .iter()
            .map(|r| match r {
                Rule::Expr { expr, message } => RuleText {
                    expr: Some(expr),
                    forbid: None,
                    message,
                },
                Rule::Forbid { knobs, message } => RuleText {
                    expr: None,
                    forbid: Some(knobs),
                    message,
                },
            })
            .collect(),
        space: family.space_size(),
    }
}

/// A batch reply: a setting, a description, or why the request failed (ksearch's message).
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Reply<'a> {
    Setting(Setting),
    Family {
        family: Description<'a>,
    },
    Error {
        #[serde(skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        error: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVariants {
    #[serde(default)]
    variant: Vec<toml::Table>,
}

/// The named settings of a variants file: `[[variant]]` tables with a `name`, an optional
/// `note`, and the knobs either in a `knobs` table or as keys of their own (both forms are in
/// use: gpu/mamba/variants.toml, gpu/attention/variants.toml). Each is completed with the
/// defaults and checked; a file with an invalid or duplicate variant is an error that names it.
pub fn load_variants(path: &Path, family: &TemplateFamily) -> Result<Vec<Setting>, KnowledgeError> {
    let raw: RawVariants = read_toml(path)?;
    if raw.variant.is_empty() {
        return Err(KnowledgeError::invalid(
            path,
            "variant",
            "declares no [[variant]]",
        ));
    }
    let mut out: Vec<Setting> = Vec::new();
    for (i, table) in raw.variant.into_iter().enumerate() {
        let invalid = |field: &str, message: String| {
            KnowledgeError::invalid(path, format!("variant[{i}]{field}"), message)
        };
        let name = match table.get("name") {
            Some(toml::Value::String(s)) if !s.trim().is_empty() => s.clone(),
            _ => return Err(invalid(".name", "missing: a non-empty string".into())),
        };
        let mut knobs = Knobs::new();
        for (key, value) in &table {
            match (key.as_str(), value) {
                ("name", _) | ("note", toml::Value::String(_)) => {}
                ("knobs", toml::Value::Table(t)) => {
                    for (k, v) in t {
                        add_knob(&mut knobs, k, v).map_err(|m| invalid(".knobs", m))?;
                    }
                }
                (k, v) => add_knob(&mut knobs, k, v).map_err(|m| invalid("", m))?,
            }
        }
        if out.iter().any(|s| s.name.as_deref() == Some(&name)) {
            return Err(invalid(".name", format!("`{name}` is defined twice")));
        }
        let full = family
            .validate(&knobs)
            .map_err(|e| invalid(&format!(" ({name})"), e.to_string()))?;
        out.push(Setting::new(Some(name), full));
    }
    Ok(out)
}

fn add_knob(knobs: &mut Knobs, key: &str, value: &toml::Value) -> Result<(), String> {
    let value = match value {
        toml::Value::Boolean(b) => KnobValue::Bool(*b),
        toml::Value::Integer(i) => KnobValue::Int(*i),
        toml::Value::String(s) => KnobValue::Str(s.clone()),
        other => {
            return Err(format!(
                "`{key}` = {other}: a knob value is a bool, integer or string"
            ))
        }
    };
    if knobs.insert(key.to_string(), value).is_some() {
        return Err(format!("knob `{key}` is given twice"));
    }
    Ok(())
}

/// Opens the family of `task_dir` for `backend` (rendering for `target`, else its first) and
/// does `job`, reading batch requests from `input` and writing to `out`.
pub fn run(
    task_dir: &Path,
    backend: &str,
    target: Option<&str>,
    job: Job<'_>,
    input: &mut dyn BufRead,
    out: &mut dyn Write,
) -> Result<(), RenderError> {
    let open = |target: Option<&str>| -> Result<TemplateFamily, RenderError> {
        let family =
            TemplateFamily::load_for(task_dir, backend)?.ok_or_else(|| RenderError::NoFamily {
                task: task_dir.to_path_buf(),
                backend: backend.to_string(),
            })?;
        Ok(match target {
            Some(t) => family.with_target(t)?,
            None => family,
        })
    };
    let family = open(target)?;
    match job {
        Job::Source(items) => {
            let mut knobs = Knobs::new();
            for item in items {
                let (k, v) = family.parse_setting(item)?;
                knobs.insert(k, v);
            }
            out.write_all(family.render(&knobs)?.as_bytes())?;
        }
        Job::All => {
            for knobs in family.enumerate() {
                json_line(out, &Setting::new(None, knobs))?;
            }
        }
        Job::Variants(path) => {
            for setting in load_variants(path, &family)? {
                json_line(out, &setting)?;
            }
        }
        Job::Batch => {
            // Families for other targets than the first, opened when a request names one.
            let mut others: BTreeMap<String, TemplateFamily> = BTreeMap::new();
            for (n, line) in input.lines().enumerate() {
                let line = line?;
                if line.trim().is_empty() {
                    continue;
                }
                let request: Request = match serde_json::from_str(&line) {
                    Ok(r) => r,
                    Err(e) => {
                        let error = format!("request line {}: {e}", n + 1);
                        json_line(out, &Reply::Error { name: None, error })?;
                        continue;
                    }
                };
                let fam = match request.target.as_deref() {
                    Some(t) if Some(t) != family.target() => {
                        if !others.contains_key(t) {
                            match open(Some(t)) {
                                Ok(f) => {
                                    others.insert(t.to_string(), f);
                                }
                                Err(e) => {
                                    let (name, error) = (request.name, e.to_string());
                                    json_line(out, &Reply::Error { name, error })?;
                                    continue;
                                }
                            }
                        }
                        &others[t]
                    }
                    _ => &family,
                };
                json_line(out, &answer(fam, request))?;
                out.flush()?;
            }
        }
    }
    out.flush()?;
    Ok(())
}

/// [`run`] on the process's stdin and stdout.
pub fn run_stdio(
    task_dir: &Path,
    backend: &str,
    target: Option<&str>,
    job: Job<'_>,
) -> Result<(), RenderError> {
    let (input, out) = (std::io::stdin(), std::io::stdout());
    run(
        task_dir,
        backend,
        target,
        job,
        &mut input.lock(),
        &mut out.lock(),
    )
}

/// The reply to one batch request.
fn answer(family: &TemplateFamily, request: Request) -> Reply<'_> {
    if request.describe {
        return Reply::Family {
            family: describe(family),
        };
    }
    let result = family.validate(&request.knobs).and_then(|full| {
        let source = match (&request.template, request.source) {
            (_, false) => None,
            (Some(t), true) => Some(family.render_template(t, &full)?),
            (None, true) => Some(family.render(&full)?),
        };
        Ok((full, source))
    });
    match result {
        Ok((full, source)) => Reply::Setting(Setting {
            source,
            ..Setting::new(request.name, full)
        }),
        Err(e) => Reply::Error {
            name: request.name,
            error: e.to_string(),
        },
    }
}

fn json_line(out: &mut dyn Write, value: &impl Serialize) -> Result<(), RenderError> {
    serde_json::to_writer(&mut *out, value).map_err(std::io::Error::from)?;
    out.write_all(b"\n")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small family in a temporary task directory: two knobs, a rule, a second template.
    fn task() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let fam = dir.path().join("templates-cuda");
        std::fs::create_dir(&fam).unwrap();
        std::fs::write(
            fam.join("family.toml"),
            r#"
[family]
name = "toy"
entry = "k.cu.j2"
backends = ["cuda"]

[[knob]]
name = "tile"
values = [16, 32, 64]
default = 16

[[knob]]
name = "fast"
type = "bool"
default = false

[[knob]]
name = "mode"
values = ["plain", "wide"]
default = "plain"

[[constraint]]
expr = "mode == 'wide' or tile <= 32"
message = "plain mode keeps tiles small"
"#,
        )
        .unwrap();
        std::fs::write(
            fam.join("k.cu.j2"),
            "// {{ knob_summary }}\n#define TILE {{ tile }}\n{% include 'dev.cuh.j2' %}",
        )
        .unwrap();
        std::fs::write(
            fam.join("dev.cuh.j2"),
            "{% if fast %}fast_path();{% else %}slow_path();{% endif %}\n",
        )
        .unwrap();
        dir
    }

    fn run_job(dir: &Path, job: Job<'_>, input: &str) -> Result<String, RenderError> {
        let mut out = Vec::new();
        run(dir, "cuda", None, job, &mut input.as_bytes(), &mut out)?;
        Ok(String::from_utf8(out).unwrap())
    }

    fn lines(text: &str) -> Vec<serde_json::Value> {
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn source_takes_typed_settings_and_fills_defaults() {
        let dir = task();
        let set = ["tile=32".to_string(), "fast=true".to_string()];
        let src = run_job(dir.path(), Job::Source(&set), "").unwrap();
        assert_eq!(
            src,
            "// fast=true mode=\"plain\" tile=32\n#define TILE 32\nfast_path();"
        );
    }

    #[test]
    fn source_reports_the_family_errors() {
        let dir = task();
        let err = |item: &str| {
            run_job(dir.path(), Job::Source(&[item.to_string()]), "")
                .unwrap_err()
                .to_string()
        };
        assert!(err("tile=48").contains("outside its domain [16, 32, 64]"));
        assert!(err("fast=1").contains("`fast` = \"1\" is outside its domain [false, true]"));
        assert!(err("warps=4").contains("has no knob `warps`"));
        assert!(err("tile").contains("expected KNOB=VALUE"));
        assert!(err("tile=64").contains("plain mode keeps tiles small"));
        let none = run(
            dir.path(),
            "mlx",
            None,
            Job::All,
            &mut &b""[..],
            &mut Vec::new(),
        );
        assert!(
            matches!(none, Err(RenderError::NoFamily { .. })),
            "{none:?}"
        );
    }

    #[test]
    fn all_lists_every_valid_setting_with_its_labels() {
        let dir = task();
        let all = lines(&run_job(dir.path(), Job::All, "").unwrap());
        // 3 tiles x 2 x 2 modes, less tile 64 in plain mode (twice: fast or not).
        assert_eq!(all.len(), 10);
        assert!(all.iter().all(|s| s.get("source").is_none()));
        let first = &all[0];
        assert_eq!(
            first["knobs"],
            serde_json::json!({"fast": false, "mode": "plain", "tile": 16})
        );
        assert_eq!(first["knob_summary"], "fast=false mode=\"plain\" tile=16");
        let ids: std::collections::BTreeSet<_> = all
            .iter()
            .map(|s| s["variant_id"].as_str().unwrap())
            .collect();
        assert_eq!(ids.len(), 10);
    }

    #[test]
    fn variant_ids_depend_on_the_setting_only() {
        let a = Knobs::from([("x".into(), KnobValue::Int(1)), ("y".into(), true.into())]);
        let mut b = Knobs::new();
        b.insert("y".into(), true.into());
        b.insert("x".into(), KnobValue::Int(1));
        assert_eq!(variant_id(&a), variant_id(&b));
        assert_eq!(variant_id(&a).len(), 10);
        b.insert("x".into(), KnobValue::Int(2));
        assert_ne!(variant_id(&a), variant_id(&b));
    }

    #[test]
    fn variants_files_in_both_forms_are_completed_and_checked() {
        let dir = task();
        let file = dir.path().join("variants.toml");
        std::fs::write(
            &file,
            "[[variant]]\nname = \"flat\"\nnote = \"keys of their own\"\ntile = 32\n\n\
             [[variant]]\nname = \"table\"\nknobs = { mode = \"wide\", tile = 64 }\n",
        )
        .unwrap();
        let out = lines(&run_job(dir.path(), Job::Variants(&file), "").unwrap());
        assert_eq!(out.len(), 2);
        assert_eq!(out[0]["name"], "flat");
        assert_eq!(
            out[0]["knobs"],
            serde_json::json!({"fast": false, "mode": "plain", "tile": 32})
        );
        assert_eq!(out[1]["knobs"]["tile"], 64);

        let bad = |text: &str| {
            std::fs::write(&file, text).unwrap();
            run_job(dir.path(), Job::Variants(&file), "")
                .unwrap_err()
                .to_string()
        };
        assert!(
            bad("[[variant]]\nname = \"v\"\nmode = \"plain\"\ntile = 64\n")
                .contains("variant[0] (v)`: family `toy`: plain mode keeps tiles small")
        );
        assert!(
            bad("[[variant]]\nname = \"v\"\n\n[[variant]]\nname = \"v\"\n")
                .contains("`v` is defined twice")
        );
        assert!(bad("[[variant]]\ntile = 32\n").contains("variant[0].name"));
        assert!(
            bad("[[variant]]\nname = \"v\"\ntile = 32\nknobs = { tile = 16 }\n")
                .contains("knob `tile` is given twice")
        );
        assert!(bad("[[variant]]\nname = \"v\"\ntile = 1.5\n").contains("a knob value is"));
    }

    #[test]
    fn batch_answers_each_line_and_keeps_going_after_an_error() {
        let dir = task();
        let input = [
            r#"{"name": "a", "knobs": {"tile": 32}}"#,
            r#"{"name": "b", "knobs": {"tile": 64}}"#,
            r#"{"knobs": {"fast": true}, "template": "dev.cuh.j2"}"#,
            r#"{"knobs": {"fast": 1}}"#,
            "not json",
            "",
            r#"{"knobs": {"mode": "wide", "tile": 64}, "source": false}"#,
            r#"{"target": "mlx-metal"}"#,
            r#"{"describe": true}"#,
        ]
        .join("\n");
        let out = lines(&run_job(dir.path(), Job::Batch, &input).unwrap());
        assert_eq!(out.len(), 8, "{out:?}");
        assert_eq!(out[0]["name"], "a");
        assert!(out[0]["source"]
            .as_str()
            .unwrap()
            .contains("#define TILE 32\n"));
        assert_eq!(out[1]["name"], "b");
        assert!(out[1]["error"]
            .as_str()
            .unwrap()
            .contains("plain mode keeps tiles small"));
        assert_eq!(out[2]["source"], "fast_path();");
        assert!(out[3]["error"]
            .as_str()
            .unwrap()
            .contains("outside its domain"));
        assert!(out[4]["error"]
            .as_str()
            .unwrap()
            .starts_with("request line 5:"));
        assert_eq!(out[5]["knobs"]["tile"], 64);
        assert!(out[5].get("source").is_none());
        assert!(out[6]["error"]
            .as_str()
            .unwrap()
            .contains("target `mlx-metal`"));
        let family = &out[7]["family"];
        assert_eq!(family["name"], "toy");
        assert_eq!(family["space"], 12);
        assert_eq!(family["knobs"][0]["name"], "tile");
        assert_eq!(
            family["knobs"][0]["values"],
            serde_json::json!([16, 32, 64])
        );
        assert_eq!(
            family["rules"][0]["message"],
            "plain mode keeps tiles small"
        );
    }

    #[test]
    fn batch_renders_for_another_target_of_the_family() {
        let dir = tempfile::tempdir().unwrap();
        let fam = dir.path().join("templates-mlx");
        std::fs::create_dir(&fam).unwrap();
        std::fs::write(
            fam.join("family.toml"),
            "[family]\nname = \"t\"\nentry = \"m.py.j2\"\ntargets = [\"mlx-cuda\", \"mlx-metal\"]\n\
             [[knob]]\nname = \"k\"\nvalues = [1, 2]\ndefault = 1\n\
             [[constraint]]\nexpr = \"target == 'mlx-cuda' or k == 1\"\nmessage = \"metal: k = 1\"\n",
        )
        .unwrap();
        std::fs::write(fam.join("m.py.j2"), "{{ target }} {{ k }}\n").unwrap();
        let input = "{\"knobs\": {\"k\": 2}}\n{\"target\": \"mlx-metal\"}\n\
                     {\"target\": \"mlx-metal\", \"knobs\": {\"k\": 2}}\n";
        let mut out = Vec::new();
        run(
            dir.path(),
            "mlx",
            None,
            Job::Batch,
            &mut input.as_bytes(),
            &mut out,
        )
        .unwrap();
        let out = lines(&String::from_utf8(out).unwrap());
        assert_eq!(out[0]["source"], "mlx-cuda 2\n");
        assert_eq!(out[1]["source"], "mlx-metal 1\n");
        assert!(out[2]["error"].as_str().unwrap().contains("metal: k = 1"));
    }
}
