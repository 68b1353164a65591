//! The validated task model: what `task.toml` means once every name, type and expression has
//! been checked. Workloads resolved to concrete shapes live here too, since they serialize
//! exactly as the `workloads` items of the harness protocol.

use crate::expr::Expr;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

/// The only task format version this crate reads.
pub const FORMAT_VERSION: i64 = 1;

/// An element type of a tensor.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F16,
    BF16,
    F32,
    F64,
    I32,
    I64,
}

impl DType {
    pub const ALL: [DType; 6] = [
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::I32,
        DType::I64,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I32 => "i32",
            DType::I64 => "i64",
        }
    }

    pub fn parse(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.as_str() == s)
    }

    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
        }
    }

    pub fn is_float(self) -> bool {
        !matches!(self, DType::I32 | DType::I64)
    }

    /// The tolerance used when a task sets none for this dtype. Integers compare exactly.
    pub fn default_tolerance(self) -> Tolerance {
        let (rtol, atol) = match self {
            DType::F16 => (1e-2, 5e-3),
            DType::BF16 => (2e-2, 1e-2),
            DType::F32 => (2e-5, 1e-5),
            DType::F64 => (1e-10, 1e-10),
            DType::I32 | DType::I64 => (0.0, 0.0),
        };
        Tolerance::scaled(rtol, atol)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Correctness tolerance of one dtype: which elements are close (`rule`) and which fraction of
/// an output's elements must be (`matched_ratio`, 1 unless the task says otherwise).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    pub rtol: f64,
    pub atol: f64,
    #[serde(default, skip_serializing_if = "ToleranceRule::is_default")]
    pub rule: ToleranceRule,
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub matched_ratio: f64,
}

fn one() -> f64 {
    1.0
}

fn is_one(x: &f64) -> bool {
    *x == 1.0
}

impl Tolerance {
    /// The default rule with every element required to pass.
    pub fn scaled(rtol: f64, atol: f64) -> Tolerance {
        Tolerance {
            rtol,
            atol,
            rule: ToleranceRule::Scaled,
            matched_ratio: 1.0,
        }
    }
}

/// When an output element counts as close to the reference.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ToleranceRule {
    /// `|out - ref| <= atol * max|ref| + rtol * |ref|`: `atol` is relative to the output's
    /// largest reference magnitude, so one task works across input scales.
    #[default]
    Scaled,
    /// FlashInfer-Bench's rule: an element fails only when its absolute error exceeds `atol`
    /// *and* its relative error `|out - ref| / (|ref| + 1e-8)` exceeds `rtol`.
    Either,
}

impl ToleranceRule {
    fn is_default(&self) -> bool {
        *self == ToleranceRule::Scaled
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ToleranceRule::Scaled => "scaled",
            ToleranceRule::Either => "either",
        }
    }
}

/// A workload's value for one axis: an integer, or a string for `type = "str"` axes (`"f16"`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(untagged)]
pub enum ParamValue {
    Int(i64),
    Str(String),
}

impl fmt::Display for ParamValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamValue::Int(i) => write!(f, "{i}"),
            ParamValue::Str(s) => write!(f, "{s:?}"),
        }
    }
}

/// How the harness fills an input tensor. `rand_int` draws from `[low, high)`; `custom` calls
/// `function(rng, shape, params)` in the task's `reference.py`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Distribution {
    Normal {
        mean: f64,
        std: f64,
    },
    Uniform {
        low: f64,
        high: f64,
    },
    #[serde(alias = "randint")]
    RandInt {
        low: i64,
        high: i64,
    },
    Custom {
        function: String,
        /// Values the generator is documented to draw on every call, as the task declares them
        /// (`reach = { low = -100.0, high = 100.0 }`: some value at or below -100 and some at
        /// or above 100). ksearch cannot run the generator, so this declaration is what
        /// `ksearch tasks --check` compares with `must_reach`; the task's own tests should
        /// confirm it. `None`: the generator's range is unknown.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reach: Option<Reach>,
    },
}

/// How far a `normal` draw is taken to reach: `mean ± NORMAL_REACH_STD * std`. A tensor of
/// ten thousand elements goes past both ends with probability above 0.9999.
pub const NORMAL_REACH_STD: f64 = 3.0;

impl Distribution {
    /// How low and how high a draw of this distribution goes (for `must_reach`); both `None`
    /// for a custom generator without a declared `reach`.
    pub fn reach(&self) -> Reach {
        let both = |low: f64, high: f64| Reach {
            low: Some(low),
            high: Some(high),
        };
        match self {
            Distribution::Normal { mean, std } => {
                both(mean - NORMAL_REACH_STD * std, mean + NORMAL_REACH_STD * std)
            }
            Distribution::Uniform { low, high } => both(*low, *high),
            Distribution::RandInt { low, high } => both(*low as f64, (*high - 1) as f64),
            Distribution::Custom { reach, .. } => reach.unwrap_or(Reach {
                low: None,
                high: None,
            }),
        }
    }

    /// A short description for messages: `normal(mean 0, std 4)`, `custom make_x`.
    pub fn describe(&self) -> String {
        match self {
            Distribution::Normal { mean, std } => format!("normal(mean {mean}, std {std})"),
            Distribution::Uniform { low, high } => format!("uniform[{low}, {high})"),
            Distribution::RandInt { low, high } => format!("rand_int[{low}, {high})"),
            Distribution::Custom { function, reach } => {
                let mut out = format!("custom {function}");
                if let Some(r) = reach {
                    let side = |name: &str, v: Option<f64>| v.map(|v| format!("{name} {v}"));
                    let sides: Vec<String> = [side("low", r.low), side("high", r.high)]
                        .into_iter()
                        .flatten()
                        .collect();
                    out.push_str(&format!(" (declared reach: {})", sides.join(", ")));
                }
                out
            }
        }
    }
}

impl Default for Distribution {
    fn default() -> Self {
        Distribution::Normal {
            mean: 0.0,
            std: 1.0,
        }
    }
}

/// The value type of an axis.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum AxisType {
    Int,
    Str,
}

/// What a kernel may assume about one int axis: the axis takes only `values`, every value is
/// a multiple of `multiple_of`, and lies in `[min, max]`. Every workload the assumption applies
/// to must satisfy it (the loader checks); whatever a task does not declare, its held-out
/// workloads must vary (`ksearch tasks --check`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct Assumption {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values: Option<Vec<i64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiple_of: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<i64>,
}

impl Assumption {
    pub fn is_empty(&self) -> bool {
        self.values.is_none()
            && self.multiple_of.is_none()
            && self.min.is_none()
            && self.max.is_none()
    }

    /// `None` when `v` satisfies the assumption, else the part it breaks (`a multiple of 8`).
    pub fn broken_by(&self, v: i64) -> Option<String> {
        if let Some(values) = &self.values {
            if !values.contains(&v) {
                return Some(format!("one of {}", join(values)));
            }
        }
        if let Some(k) = self.multiple_of {
            if k != 0 && v % k != 0 {
                return Some(format!("a multiple of {k}"));
            }
        }
        if let Some(min) = self.min {
            if v < min {
                return Some(format!(">= {min}"));
            }
        }
        if let Some(max) = self.max {
            if v > max {
                return Some(format!("<= {max}"));
            }
        }
        None
    }

    /// What the assumption says, for people and prompts: `one of 64, 128`, `a multiple of 8,
    /// 1..64`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(values) = &self.values {
            parts.push(format!("one of {}", join(values)));
        }
        if let Some(k) = self.multiple_of {
            parts.push(format!("a multiple of {k}"));
        }
        match (self.min, self.max) {
            (Some(lo), Some(hi)) => parts.push(format!("between {lo} and {hi}")),
            (Some(lo), None) => parts.push(format!(">= {lo}")),
            (None, Some(hi)) => parts.push(format!("<= {hi}")),
            (None, None) => {}
        }
        parts.join(", ")
    }
}

fn join(values: &[i64]) -> String {
    values
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Values at or below `low` and at or above `high`: what some workload of every backend must
/// draw for an input (`[[inputs]] must_reach`, checked by `ksearch tasks --check`), and what a
/// custom generator declares that it draws (`reach`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
pub struct Reach {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub low: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high: Option<f64>,
}

/// A named dimension or parameter that workloads bind.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Axis {
    pub name: String,
    #[serde(rename = "type")]
    pub ty: AxisType,
    pub description: String,
    /// str axes only: the value of workloads that leave the axis out. It applies to shapes,
    /// `"$dtype"` and `elem_bytes`, but is not listed in those workloads' `params`, so adding
    /// a defaulted axis leaves the requests of existing workloads unchanged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
    /// int axes only: what kernels of every backend may assume (`[axes.<NAME>]` `values`,
    /// `multiple_of`, `min`, `max`).
    #[serde(skip_serializing_if = "Assumption::is_empty")]
    pub assume: Assumption,
}

/// A tensor's dtype as written: fixed, or `"$dtype"`, the workload's `dtype` parameter.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DTypeSpec {
    Fixed(DType),
    FromParam,
}

impl Serialize for DTypeSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            DTypeSpec::Fixed(d) => s.serialize_str(d.as_str()),
            DTypeSpec::FromParam => s.serialize_str("$dtype"),
        }
    }
}

/// An input or output as declared (shapes unresolved).
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: DTypeSpec,
    pub shape: Vec<Expr>,
    /// Inputs only; `None` means the default, normal(0, 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dist: Option<Distribution>,
    /// Inputs only: values some workload of every backend must draw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub must_reach: Option<Reach>,
    pub description: String,
}

/// One workload as declared.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct WorkloadSpec {
    pub name: String,
    pub params: BTreeMap<String, ParamValue>,
    pub held_out: bool,
    /// Backends this workload applies to; `None` means all.
    pub backends: Option<Vec<String>>,
    /// Distributions that replace inputs' own `dist` in this workload, by input name.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub dist: BTreeMap<String, Distribution>,
}

/// FLOP and byte formulas of the roofline floor.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Roofline {
    pub flops: Expr,
    pub bytes: Expr,
}

/// Where the ground truth lives: `function` in the Python file `module` of the task dir.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct ReferenceSpec {
    pub module: String,
    pub function: String,
}

/// How one backend calls a kernel.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct BackendSpec {
    /// The symbol (cpu, cuda) or Python function (mlx) the candidate must define. It may
    /// contain `{axis}` placeholders naming str axes (`attention_{dtype}`), filled per
    /// workload: see [`BackendSpec::entry_for`].
    pub entry: String,
    /// Call order: input, output and axis names (cpu, cuda: tensors as pointers, int axes as
    /// int64_t; cuda appends the stream). mlx lists inputs and axes only (outputs are
    /// returned), passed as keyword arguments.
    pub args: Vec<String>,
    /// The prototype shown to proposers.
    pub signature: String,
    /// Source language: `"c"` or `"c++"` (cpu), `"cuda"` (cuda), `"python"` (mlx).
    pub language: String,
    /// Absolute path of the seed kernel.
    pub seed: Option<PathBuf>,
    /// This backend's reference function in the reference module; `None`: the task's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// Function name of the timed baseline in the reference module.
    pub baseline: Option<String>,
    /// Identifiers a candidate must not mention (always includes the reference and baseline
    /// functions).
    pub forbidden: Vec<String>,
    /// Library kernels a candidate of this GPU backend may run besides its own, as regular
    /// expressions searched in the kernel names the harness records (its kernel audit); the
    /// backend's copies and fills are always allowed. For tasks whose operation is a library
    /// one, such as the `copy` calibration task's MLX copy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_kernels: Vec<String>,
    /// What kernels of this backend may assume about int axes, by axis name, on top of the
    /// axis's own assumption (`[backends.<b>.assume.<NAME>]`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub assume: BTreeMap<String, Assumption>,
}

impl BackendSpec {
    /// The entry with its `{axis}` placeholders filled from a workload's params
    /// (`attention_{dtype}` -> `attention_bf16`); `None` when a placeholder names no string
    /// param of `params` (the loader rejects tasks where that can happen).
    pub fn entry_for(&self, params: &BTreeMap<String, ParamValue>) -> Option<String> {
        fill_placeholders(&self.entry, |name| match params.get(name) {
            Some(ParamValue::Str(s)) => Some(s.clone()),
            _ => None,
        })
    }

    /// The names of the `{axis}` placeholders in the entry, in order.
    pub fn entry_placeholders(&self) -> Vec<String> {
        placeholders(&self.entry)
    }

    /// A short label for the baseline, for the protocol's `baseline.name`: the function name
    /// without a leading `baseline_` (`baseline_numpy` → `numpy`).
    pub fn baseline_label(&self) -> Option<&str> {
        self.baseline.as_deref().map(|f| {
            f.strip_prefix("baseline_")
                .filter(|s| !s.is_empty())
                .unwrap_or(f)
        })
    }
}

/// A validated `task.toml`.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct TaskSpec {
    pub format: i64,
    pub name: String,
    pub kind: String,
    pub description: String,
    /// In declaration order.
    pub axes: Vec<Axis>,
    pub workloads: Vec<WorkloadSpec>,
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
    /// Only the dtypes the task overrides; see `Task::tolerance` for the effective value.
    pub tolerance: BTreeMap<DType, Tolerance>,
    pub roofline: Roofline,
    pub reference: ReferenceSpec,
    pub backends: BTreeMap<String, BackendSpec>,
}

impl TaskSpec {
    pub fn axis(&self, name: &str) -> Option<&Axis> {
        self.axes.iter().find(|a| a.name == name)
    }

    /// What kernels of `backend` may assume about `axis`: the axis's own assumption and the
    /// backend's, the empty ones left out.
    pub fn assumptions(&self, backend: &str, axis: &str) -> Vec<&Assumption> {
        let own = self.axis(axis).map(|a| &a.assume);
        let backend = self.backends.get(backend).and_then(|b| b.assume.get(axis));
        own.into_iter()
            .chain(backend)
            .filter(|a| !a.is_empty())
            .collect()
    }

    /// [`TaskSpec::assumptions`] in words (`one of 64, 128`), or `None` when a kernel may
    /// assume nothing about the axis on this backend.
    pub fn assumption_text(&self, backend: &str, axis: &str) -> Option<String> {
        let parts: Vec<String> = self
            .assumptions(backend, axis)
            .iter()
            .map(|a| a.describe())
            .collect();
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

/// A tensor with a concrete shape, as sent to the harness.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ResolvedTensor {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dist: Option<Distribution>,
}

impl ResolvedTensor {
    pub fn numel(&self) -> i64 {
        self.shape.iter().product()
    }

    pub fn size_bytes(&self) -> i64 {
        self.numel() * self.dtype.size_bytes() as i64
    }
}

/// A workload with every shape and formula evaluated, as sent to the harness.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ResolvedWorkload {
    pub name: String,
    pub held_out: bool,
    pub params: BTreeMap<String, ParamValue>,
    pub inputs: Vec<ResolvedTensor>,
    pub outputs: Vec<ResolvedTensor>,
    pub flops: f64,
    pub bytes: f64,
}

/// The literal pieces of `text` around its `{name}` placeholders, in order, one more than the
/// placeholders: `a_{x}_b` → `["a_", "_b"]`, `f_{x}` → `["f_", ""]`. What an entry named per
/// workload holds whatever its placeholders are filled with; a `{` never closed ends the text.
pub fn placeholder_pieces(text: &str) -> Vec<&str> {
    split_placeholders(text).0
}

/// `{name}` placeholders of `text`, in order.
pub(crate) fn placeholders(text: &str) -> Vec<String> {
    split_placeholders(text)
        .1
        .into_iter()
        .map(str::to_string)
        .collect()
}

/// `text` split at its `{name}` placeholders: the literal pieces (one more than the names) and
/// the names. A `{` never closed ends the text: an empty last piece, no name.
fn split_placeholders(text: &str) -> (Vec<&str>, Vec<&str>) {
    let (mut pieces, mut names) = (Vec::new(), Vec::new());
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        pieces.push(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find('}') {
            Some(close) => {
                names.push(&after[..close]);
                rest = &after[close + 1..];
            }
            None => {
                rest = "";
                break;
            }
        }
    }
    pieces.push(rest);
    (pieces, names)
}

/// `text` with each `{name}` replaced by `value(name)`; `None` if a name has no value or a
/// brace is unbalanced.
pub(crate) fn fill_placeholders(
    text: &str,
    value: impl Fn(&str) -> Option<String>,
) -> Option<String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(open) = rest.find(['{', '}']) {
        if rest[open..].starts_with('}') {
            return None;
        }
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let close = after.find('}')?;
        out.push_str(&value(&after[..close])?);
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholder_pieces_are_the_text_between_placeholders() {
        assert_eq!(placeholder_pieces("attention_{dtype}"), ["attention_", ""]);
        assert_eq!(placeholder_pieces("a_{x}_{y}b"), ["a_", "_", "b"]);
        assert_eq!(placeholder_pieces("{x}"), ["", ""]);
        assert_eq!(placeholder_pieces("plain"), ["plain"]);
        // One more piece than placeholders.
        let entry = "k_{a}{b}_c";
        assert_eq!(
            placeholder_pieces(entry).len(),
            placeholders(entry).len() + 1
        );
        assert_eq!(placeholder_pieces("open_{x"), ["open_", ""]);
    }
}
