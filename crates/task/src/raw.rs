//! `task.toml` exactly as written, before any checking beyond TOML types. Unknown keys are
//! rejected so a misspelt field never silently takes its default.

use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTask {
    pub format: Option<i64>,
    pub name: Option<String>,
    pub kind: Option<String>,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub axes: BTreeMap<String, RawAxis>,
    #[serde(default)]
    pub workloads: Vec<RawWorkload>,
    #[serde(default)]
    pub inputs: Vec<RawTensor>,
    #[serde(default)]
    pub outputs: Vec<RawOutput>,
    #[serde(default)]
    pub tolerance: BTreeMap<String, RawTolerance>,
    pub roofline: Option<RawRoofline>,
    pub reference: Option<RawReference>,
    #[serde(default)]
    pub backends: BTreeMap<String, RawBackend>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAxis {
    #[serde(default)]
    pub description: String,
    #[serde(rename = "type")]
    pub ty: Option<String>,
    /// The value of a str axis in workloads that leave it out.
    pub default: Option<toml::Value>,
    /// What a kernel may assume about an int axis on every backend (see `RawAssume`).
    pub values: Option<Vec<i64>>,
    pub multiple_of: Option<i64>,
    pub min: Option<i64>,
    pub max: Option<i64>,
}

/// What a kernel may assume about one int axis: its only values, a divisor of every value,
/// bounds. `[axes.<NAME>]` carries these for every backend, `[backends.<b>.assume.<NAME>]`
/// for one.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAssume {
    pub values: Option<Vec<i64>>,
    pub multiple_of: Option<i64>,
    pub min: Option<i64>,
    pub max: Option<i64>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawWorkload {
    pub name: Option<String>,
    #[serde(default)]
    pub params: BTreeMap<String, toml::Value>,
    #[serde(default)]
    pub held_out: bool,
    pub backends: Option<Vec<String>>,
    /// Per-input distributions that replace the input's own `dist` in this workload.
    #[serde(default)]
    pub dist: BTreeMap<String, toml::Value>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTensor {
    pub name: Option<String>,
    pub dtype: Option<String>,
    pub shape: Option<Vec<toml::Value>>,
    pub dist: Option<toml::Value>,
    /// Values that some workload of every backend must draw (`ksearch tasks --check`); a
    /// `RawReach` table, taken as a value so that an array is an error rather than a
    /// positional struct.
    pub must_reach: Option<toml::Value>,
    #[serde(default)]
    pub description: String,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawReach {
    pub low: Option<f64>,
    pub high: Option<f64>,
}

/// Outputs have no `dist`: they are written by the kernel, not generated.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawOutput {
    pub name: Option<String>,
    pub dtype: Option<String>,
    pub shape: Option<Vec<toml::Value>>,
    #[serde(default)]
    pub description: String,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTolerance {
    pub rtol: Option<f64>,
    pub atol: Option<f64>,
    pub rule: Option<String>,
    pub matched_ratio: Option<f64>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRoofline {
    pub flops: Option<toml::Value>,
    pub bytes: Option<toml::Value>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawReference {
    pub module: Option<String>,
    pub function: Option<String>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBackend {
    pub entry: Option<String>,
    pub args: Option<Vec<String>>,
    pub signature: Option<String>,
    pub language: Option<String>,
    pub seed: Option<String>,
    /// This backend's reference function, when it is not the task's `[reference]` one.
    pub reference: Option<String>,
    pub baseline: Option<String>,
    #[serde(default)]
    pub forbidden: Vec<String>,
    /// Library kernels (patterns of their names) a GPU candidate may run besides its own.
    #[serde(default)]
    pub allowed_kernels: Vec<String>,
    /// What kernels of this backend may assume about int axes, on top of `[axes.<NAME>]`.
    #[serde(default)]
    pub assume: BTreeMap<String, RawAssume>,
}

fn zero() -> f64 {
    0.0
}

fn one() -> f64 {
    1.0
}

/// An input distribution as written; `custom.function` defaults to `make_<input>`.
#[derive(Deserialize, Debug)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum RawDist {
    Normal {
        #[serde(default = "zero")]
        mean: f64,
        #[serde(default = "one")]
        std: f64,
    },
    Uniform {
        #[serde(default = "zero")]
        low: f64,
        #[serde(default = "one")]
        high: f64,
    },
    #[serde(alias = "randint")]
    RandInt { low: i64, high: i64 },
    Custom {
        function: Option<String>,
        /// `{ low, high }`: values the generator is documented to draw (for the reach check);
        /// a `RawReach` table.
        reach: Option<toml::Value>,
    },
}
