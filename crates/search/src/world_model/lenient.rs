//! Lenient edit parser: accepts both the canonical patch language and the original K-Search
//! dialect (`update_node` / `insert_node` / `split_node` / `delete_node`, `patch` /
//! `parent_patch`, `overall_rating_0_to_10`, `difficulty_1_to_5`, ...), so LLM replies in
//! either form work. It only translates names and coerces numbers; what is allowed is still
//! decided by [`super::WorldModel::apply_edit`].

use serde_json::{Map, Value};

use super::error::PatchError;
use super::node::NodeId;
use super::patch::{Edit, PatchOp};

impl Edit {
    /// Parses an edit object (`{"ops": [...], "active_leaf_id": ...}`) or a bare op list.
    /// Every malformed op is reported with its index.
    pub fn from_json_value(value: &Value) -> Result<Edit, Vec<PatchError>> {
        let malformed = |reason: &str| {
            vec![PatchError::Malformed {
                op: None,
                reason: reason.to_owned(),
            }]
        };
        let (ops, leaf) = match value {
            Value::Array(ops) => (ops, None),
            Value::Object(obj) => {
                let ops = match obj.get("ops") {
                    Some(Value::Array(ops)) => ops,
                    Some(_) => return Err(malformed("`ops` must be a list")),
                    None => return Err(malformed("no `ops` list")),
                };
                let leaf = match obj.get("active_leaf_id") {
                    None | Some(Value::Null) => None,
                    Some(v) => match id_string(v) {
                        Some(s) if !s.is_empty() => Some(NodeId::new(s)),
                        Some(_) => None,
                        None => return Err(malformed("`active_leaf_id` must be a string")),
                    },
                };
                (ops, leaf)
            }
            _ => return Err(malformed("an edit must be a JSON object or a list of ops")),
        };

        let mut out = Vec::with_capacity(ops.len());
        let mut errors = Vec::new();
        for (i, raw) in ops.iter().enumerate() {
            match canonical_op(i, raw).and_then(|v| {
                serde_json::from_value::<PatchOp>(v).map_err(|e| PatchError::Malformed {
                    op: Some(i),
                    reason: e.to_string(),
                })
            }) {
                Ok(op) => out.push(op),
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() {
            Ok(Edit {
                ops: out,
                active_leaf_id: leaf,
            })
        } else {
            Err(errors)
        }
    }

    /// Parses edit JSON text in either dialect.
    pub fn from_json_str(text: &str) -> Result<Edit, Vec<PatchError>> {
        let value: Value = serde_json::from_str(text).map_err(|e| {
            vec![PatchError::Malformed {
                op: None,
                reason: e.to_string(),
            }]
        })?;
        Self::from_json_value(&value)
    }
}

/// Ids sometimes arrive as numbers.
fn id_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.trim().to_owned()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn canonical_op(i: usize, raw: &Value) -> Result<Value, PatchError> {
    let malformed = |reason: String| PatchError::Malformed {
        op: Some(i),
        reason,
    };
    let obj = raw
        .as_object()
        .ok_or_else(|| malformed("an op must be a JSON object".into()))?;
    let name = obj
        .get("op")
        .and_then(Value::as_str)
        .ok_or_else(|| malformed("missing `op` string".into()))?;
    let id_of = |key: &str| -> Result<Value, PatchError> {
        obj.get(key)
            .and_then(id_string)
            .map(Value::String)
            .ok_or_else(|| malformed(format!("missing `{key}`")))
    };
    // For new nodes, the id of the parent the op names (a matching `parent_id` echo inside the
    // node is dropped, a different one is kept so that it is rejected).
    let fields = |keys: &[&str], parent: Option<&str>| -> Result<Value, PatchError> {
        match keys.iter().find_map(|k| obj.get(*k)) {
            None | Some(Value::Null) => Ok(Value::Object(Map::new())),
            Some(Value::Object(m)) => Ok(Value::Object(canonical_fields(m, parent))),
            Some(_) => Err(malformed(format!("`{}` must be an object", keys[0]))),
        }
    };
    let mut out = Map::new();
    match name {
        "update" | "update_node" => {
            out.insert("op".into(), "update".into());
            out.insert("node_id".into(), id_of("node_id")?);
            out.insert("set".into(), fields(&["set", "patch"], None)?);
        }
        "insert" | "insert_node" => {
            out.insert("op".into(), "insert".into());
            let parent = id_of("parent_id")?;
            if let Some(s) = obj.get("parent_solution_id").and_then(id_string) {
                out.insert("parent_solution_id".into(), Value::String(s));
            }
            out.insert("node".into(), fields(&["node"], parent.as_str())?);
            out.insert("parent_id".into(), parent);
        }
        "split" | "split_node" => {
            out.insert("op".into(), "split".into());
            let node_id = id_of("node_id")?;
            out.insert("set".into(), fields(&["set", "parent_patch"], None)?);
            let children = match obj.get("children") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(cs)) => cs
                    .iter()
                    .map(|c| match c {
                        Value::Object(m) => {
                            Ok(Value::Object(canonical_fields(m, node_id.as_str())))
                        }
                        _ => Err(malformed("each child must be an object".into())),
                    })
                    .collect::<Result<_, _>>()?,
                Some(_) => return Err(malformed("`children` must be a list".into())),
            };
            out.insert("node_id".into(), node_id);
            out.insert("children".into(), Value::Array(children));
        }
        "delete" | "delete_node" => {
            out.insert("op".into(), "delete".into());
            out.insert("node_id".into(), id_of("node_id")?);
        }
        // Tree-level ops keep their fields as given; serde reports a missing or unknown one.
        "set_summary" | "close_question" => return Ok(raw.clone()),
        other => {
            return Err(PatchError::UnknownOp {
                op: i,
                name: other.to_owned(),
            })
        }
    }
    Ok(Value::Object(out))
}

/// Number-ish values: numbers, or strings holding a number.
fn as_number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok().filter(|x| x.is_finite()),
        _ => None,
    }
}

fn number_value(v: &Value) -> Value {
    as_number(v)
        .and_then(serde_json::Number::from_f64)
        .map(Value::Number)
        .unwrap_or_else(|| v.clone())
}

/// Renames original-dialect node fields to canonical ones. Unknown keys are kept so that
/// `apply_edit` rejects them by name. `parent` is set for new nodes (insert, split children).
fn canonical_fields(m: &Map<String, Value>, parent: Option<&str>) -> Map<String, Value> {
    let new_node = parent.is_some();
    let mut out = Map::new();
    for (k, v) in m {
        match k.as_str() {
            // Derived by the original and ignored there; echoing it back is harmless.
            "node_type" => {}
            // The original let the LLM set it; here the system stamps it, so drop the echo.
            "last_updated_round" => {}
            // A suggested id for a new node becomes its label.
            "node_id" | "id" if new_node => {
                if !m.contains_key("label") {
                    if let Some(s) = id_string(v) {
                        out.insert("label".into(), Value::String(s));
                    }
                }
            }
            "parent_id" if id_string(v).as_deref() == parent => {}
            // An empty solution placeholder on a new node is harmless; a real solution id is
            // kept so that it is rejected.
            "solution_ref" if new_node && !has_solution_id(v) => {}
            "overall_rating_0_to_10" | "overall_rating" => {
                out.insert("overall_rating".into(), number_value(v));
            }
            "confidence_0_to_1" | "confidence" => {
                out.insert("confidence".into(), number_value(v));
            }
            "action" => {
                out.insert(
                    "action".into(),
                    match v {
                        Value::Object(a) => Value::Object(canonical_action(a)),
                        other => other.clone(),
                    },
                );
            }
            "impacts" => {
                out.insert(
                    "impacts".into(),
                    match v {
                        Value::Object(im) => Value::Object(canonical_impacts(im)),
                        other => other.clone(),
                    },
                );
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    out
}

fn has_solution_id(v: &Value) -> bool {
    v.get("solution_id")
        .is_some_and(|s| !s.is_null() && s.as_str() != Some(""))
}

fn canonical_action(a: &Map<String, Value>) -> Map<String, Value> {
    let mut out = Map::new();
    for (k, v) in a {
        match k.as_str() {
            "difficulty_1_to_5" | "difficulty" => {
                // The original turned a non-number into the default difficulty.
                let d = as_number(v).unwrap_or(f64::from(super::node::DEFAULT_DIFFICULTY));
                out.insert("difficulty".into(), Value::from(d));
            }
            "difficulty_0_to_3" => {
                if !a.contains_key("difficulty_1_to_5") && !a.contains_key("difficulty") {
                    let d = as_number(v)
                        .map_or(f64::from(super::node::DEFAULT_DIFFICULTY), |x| x + 1.0);
                    out.insert("difficulty".into(), Value::from(d));
                }
            }
            "score_0_to_1" | "score" => {
                let s = if v.is_null() {
                    Value::Null
                } else {
                    number_value(v)
                };
                out.insert("score".into(), s);
            }
            "expected_vs_baseline_factor" => {
                // A missing or unparseable prediction means "no prediction".
                let f = as_number(v)
                    .and_then(serde_json::Number::from_f64)
                    .map_or(Value::Null, Value::Number);
                out.insert(k.clone(), f);
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    out
}

fn canonical_impacts(im: &Map<String, Value>) -> Map<String, Value> {
    let mut out = Map::new();
    for (k, v) in im {
        let Value::Object(one) = v else {
            out.insert(k.clone(), v.clone());
            continue;
        };
        let mut fixed = Map::new();
        let mut hw_notes = None;
        for (ik, iv) in one {
            match ik.as_str() {
                "rating_0_to_10" | "rating" => {
                    fixed.insert("rating".into(), number_value(iv));
                }
                // Only the original's third impact had a separate hardware note; fold it in.
                "hw_notes" => hw_notes = iv.as_str().map(str::to_owned),
                _ => {
                    fixed.insert(ik.clone(), iv.clone());
                }
            }
        }
        if let Some(hw) = hw_notes.filter(|s| !s.trim().is_empty()) {
            let notes = match fixed.get("notes").and_then(Value::as_str) {
                Some(n) if !n.is_empty() => format!("{n} (hw: {hw})"),
                _ => format!("hw: {hw}"),
            };
            fixed.insert("notes".into(), Value::String(notes));
        }
        out.insert(k.clone(), Value::Object(fixed));
    }
    out
}
