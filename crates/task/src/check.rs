//! `ksearch tasks --check`: does a task test what a kernel could wrongly assume?
//!
//! A task states what kernels may assume (`values`, `multiple_of`, `min`, `max` on an int axis,
//! for every backend or per backend) and which input values matter numerically (`must_reach`
//! on an input). Everything else must be varied by its workloads, or a kernel tuned on the
//! visible ones could rely on an accident of their shapes and still be accepted. Per backend,
//! over all its workloads (visible and held out), the check reports:
//!
//! - no held-out workload at all;
//! - an int axis whose values all share a divisor > 1 that the task does not declare (or
//!   share more than the declared `multiple_of`), or that takes a single value without
//!   declaring it (`values = [16]`); axes with declared `values` are exempt;
//! - an input with `must_reach` whose workloads' distributions never reach `low` or `high`
//!   (a `normal` draw reaches mean ± 3 std, `uniform` and `rand_int` their bounds, a `custom`
//!   generator its declared `reach = { low, high }`, or nothing).
//!
//! Each problem is a [`SpecError`] pointing at the field (axis, input, `workloads`) to change.
//! `docs/task-format.md` documents the declarations.

use crate::error::{SpecError, TaskError};
use crate::load::Ctx;
use crate::source_map::{FieldPath, SourceMap};
use crate::spec::{Distribution, ParamValue, Reach, ResolvedWorkload, NORMAL_REACH_STD};
use crate::Task;
use serde::{Serialize, Serializer};
use std::collections::BTreeSet;
use std::path::Path;

/// One task's check, as `ksearch tasks --check` reports it: the task's name (or the name or
/// directory it was asked by, when it does not load), its directory, and its problems (a task
/// that does not load has its load error as its one problem).
#[derive(Debug, Serialize)]
pub struct CheckedTask {
    pub task: String,
    pub dir: String,
    pub ok: bool,
    #[serde(serialize_with = "problems_json")]
    pub problems: Vec<SpecError>,
}

/// A problem in JSON: `file`, `line`, `field`, `message`.
fn problems_json<S: Serializer>(problems: &[SpecError], s: S) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Problem<'a> {
        file: String,
        line: Option<usize>,
        field: &'a str,
        message: &'a str,
    }
    s.collect_seq(problems.iter().map(|e| Problem {
        file: e.file.display().to_string(),
        line: e.line,
        field: &e.field,
        message: &e.message,
    }))
}

/// Checks the task `target` names (a built-in name or a task directory), or every built-in
/// task. A task that does not load is a failed check; a name that matches nothing, or a
/// directory that cannot be read, is an error.
pub fn check_tasks(target: Option<&str>) -> Result<Vec<CheckedTask>, TaskError> {
    let loaded = match target {
        Some(t) => vec![(t.to_string(), crate::resolve(t))],
        None => crate::builtin::task_dirs()?
            .iter()
            .map(|d| (file_name(d), crate::load_task(d)))
            .collect(),
    };
    let mut out = Vec::new();
    for (label, task) in loaded {
        out.push(match task {
            Ok(task) => {
                let problems = check(&task);
                CheckedTask {
                    task: task.name().to_string(),
                    dir: task.dir().display().to_string(),
                    ok: problems.is_empty(),
                    problems,
                }
            }
            Err(TaskError::Invalid(e)) => CheckedTask {
                task: label,
                dir: String::new(),
                ok: false,
                problems: vec![*e],
            },
            Err(e) => return Err(e),
        });
    }
    Ok(out)
}

fn file_name(dir: &Path) -> String {
    dir.file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Every problem of `task` (empty: the task passes).
pub fn check(task: &Task) -> Vec<SpecError> {
    let ctx = Ctx {
        file: task.dir().join("task.toml"),
        map: SourceMap::new(task.source()),
    };
    let mut found = Findings::default();
    for backend in task.backend_names() {
        let Ok(workloads) = task.workloads(backend) else {
            continue;
        };
        held_out(&workloads, backend, &mut found);
        divisibility(task, &workloads, backend, &mut found);
        reach(task, &workloads, backend, &mut found);
    }
    found
        .0
        .into_iter()
        .map(|f| {
            let who = match f.backends.as_slice() {
                [one] => format!("backend `{one}`"),
                many => format!(
                    "backends {}",
                    many.iter()
                        .map(|b| format!("`{b}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            ctx.spec_error(&f.field, format!("{who}: {}", f.message))
        })
        .collect()
}

struct Finding {
    field: FieldPath,
    message: String,
    backends: Vec<String>,
}

/// Findings in discovery order; the same problem on several backends is reported once.
#[derive(Default)]
struct Findings(Vec<Finding>);

impl Findings {
    fn add(&mut self, field: FieldPath, message: String, backend: &str) {
        if let Some(f) = self
            .0
            .iter_mut()
            .find(|f| f.field == field && f.message == message)
        {
            f.backends.push(backend.to_string());
            return;
        }
        self.0.push(Finding {
            field,
            message,
            backends: vec![backend.to_string()],
        });
    }
}

fn held_out(workloads: &[ResolvedWorkload], backend: &str, found: &mut Findings) {
    if !workloads.iter().any(|w| w.held_out) {
        found.add(
            FieldPath::root().key("workloads"),
            "no held-out workload, so nothing checks that a kernel works beyond the shapes it \
             was tuned on: add workloads with `held_out = true` whose shapes break the visible \
             ones' divisibility"
                .to_string(),
            backend,
        );
    }
}

fn gcd(a: i64, b: i64) -> i64 {
    let (mut a, mut b) = (a.unsigned_abs(), b.unsigned_abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a as i64
}

fn lcm(a: i64, b: i64) -> i64 {
    if a == 0 || b == 0 {
        return 0;
    }
    (a / gcd(a, b)).saturating_mul(b)
}

/// At most eight values, then how many more.
fn list(values: &BTreeSet<i64>) -> String {
    let mut shown: Vec<String> = values.iter().take(8).map(i64::to_string).collect();
    if values.len() > 8 {
        shown.push(format!("… {} more", values.len() - 8));
    }
    shown.join(", ")
}

fn divisibility(task: &Task, workloads: &[ResolvedWorkload], backend: &str, found: &mut Findings) {
    let spec = task.spec();
    for axis in spec
        .axes
        .iter()
        .filter(|a| a.ty == crate::spec::AxisType::Int)
    {
        let declared = spec.assumptions(backend, &axis.name);
        if declared.iter().any(|a| a.values.is_some()) {
            continue;
        }
        let values: BTreeSet<i64> = workloads
            .iter()
            .filter_map(|w| match w.params.get(&axis.name) {
                Some(ParamValue::Int(v)) => Some(*v),
                _ => None,
            })
            .collect();
        let field = FieldPath::root().key("axes").key(&axis.name);
        let name = &axis.name;
        if values.len() == 1 {
            let v = values.first().copied().unwrap_or_default();
            found.add(
                field,
                format!(
                    "every workload has `{name}` = {v}, so a kernel may hard-code it: add a \
                     held-out workload with another `{name}`, or declare `values = [{v}]`"
                ),
                backend,
            );
            continue;
        }
        let shared = values.iter().fold(0, |g, v| gcd(g, *v));
        let multiple_of = declared.iter().filter_map(|a| a.multiple_of).fold(1, lcm);
        if shared <= 1 || multiple_of == 0 || shared == multiple_of {
            continue;
        }
        let message = if multiple_of == 1 {
            format!(
                "every value of `{name}` ({}) is a multiple of {shared}, which the task does not \
                 declare: add a held-out workload whose `{name}` is not a multiple of {shared} \
                 (an odd or prime size), or declare `multiple_of = {shared}`",
                list(&values)
            )
        } else {
            format!(
                "every value of `{name}` ({}) is a multiple of {shared}, but the task declares \
                 only `multiple_of = {multiple_of}`: add a held-out workload whose `{name}` is \
                 a multiple of {multiple_of} but not of {shared}, or declare `multiple_of = \
                 {shared}`",
                list(&values)
            )
        };
        found.add(field, message, backend);
    }
}

/// How a distribution reaches, in words, for messages.
fn how(dist: &Distribution) -> String {
    match dist {
        Distribution::Normal { .. } => {
            format!("{} reaching mean ± {NORMAL_REACH_STD} std", dist.describe())
        }
        _ => dist.describe(),
    }
}

fn reach(task: &Task, workloads: &[ResolvedWorkload], backend: &str, found: &mut Findings) {
    for (i, input) in task.spec().inputs.iter().enumerate() {
        let Some(want) = input.must_reach else {
            continue;
        };
        let name = &input.name;
        // (workload, its distribution of the input, what that reaches)
        let draws: Vec<(&str, &Distribution, Reach)> = workloads
            .iter()
            .filter_map(|w| {
                let t = w.inputs.iter().find(|t| &t.name == name)?;
                let d = t.dist.as_ref()?;
                Some((w.name.as_str(), d, d.reach()))
            })
            .collect();
        let unknown: Vec<&str> = draws
            .iter()
            .filter(|(_, _, r)| r.low.is_none() && r.high.is_none())
            .map(|(w, _, _)| *w)
            .collect();
        let unknown_note = if unknown.is_empty() {
            String::new()
        } else {
            format!(
                "; custom generators without a declared `reach` count as drawing nothing ({})",
                unknown.join(", ")
            )
        };
        let path = FieldPath::root().key("inputs").index(i).key("must_reach");
        if let Some(low) = want.low {
            let best = draws
                .iter()
                .filter_map(|(w, d, r)| r.low.map(|lo| (lo, *w, *d)))
                .min_by(|a, b| a.0.total_cmp(&b.0));
            if best.is_none_or(|(lo, _, _)| lo > low) {
                let closest = match best {
                    Some((lo, w, d)) => format!("the lowest is {lo} ({w}: {})", how(d)),
                    None => "none declares how low it goes".to_string(),
                };
                found.add(
                    path.key("low"),
                    format!(
                        "no workload draws `{name}` at or below {low}: {closest}{unknown_note}; \
                         add a held-out workload with `dist = {{ {name} = {{ … }} }}` that does"
                    ),
                    backend,
                );
            }
        }
        if let Some(high) = want.high {
            let best = draws
                .iter()
                .filter_map(|(w, d, r)| r.high.map(|hi| (hi, *w, *d)))
                .max_by(|a, b| a.0.total_cmp(&b.0));
            if best.is_none_or(|(hi, _, _)| hi < high) {
                let closest = match best {
                    Some((hi, w, d)) => format!("the highest is {hi} ({w}: {})", how(d)),
                    None => "none declares how high it goes".to_string(),
                };
                found.add(
                    path.key("high"),
                    format!(
                        "no workload draws `{name}` at or above {high}: {closest}{unknown_note}; \
                         add a held-out workload with `dist = {{ {name} = {{ … }} }}` that does"
                    ),
                    backend,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gcd_and_lcm() {
        assert_eq!(gcd(0, 12), 12);
        assert_eq!(gcd(1000, 4096), 8);
        assert_eq!(gcd(-6, 4), 2);
        assert_eq!(lcm(4, 6), 12);
        assert_eq!(lcm(1, 8), 8);
    }

    #[test]
    fn long_lists_are_cut() {
        let v: BTreeSet<i64> = (1..=10).collect();
        assert_eq!(list(&v), "1, 2, 3, 4, 5, 6, 7, 8, … 2 more");
    }
}
