//! A task in brief, as `ksearch tasks` lists it: name, kind, description and, per backend,
//! how many workloads it has and how many of them are held out.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{Task, TaskError};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TaskSummary {
    pub name: String,
    pub kind: String,
    pub dir: String,
    pub description: String,
    pub backends: Vec<String>,
    /// Over the whole task.
    pub workloads: usize,
    pub held_out: usize,
    /// Workloads can be limited to some backends, so each backend has its own counts.
    pub per_backend: BTreeMap<String, Counts>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub workloads: usize,
    pub held_out: usize,
}

impl TaskSummary {
    pub fn of(task: &Task) -> Result<TaskSummary, TaskError> {
        let spec = task.spec();
        let mut per_backend = BTreeMap::new();
        for b in task.backend_names() {
            let workloads = task.workloads(b)?;
            let held_out = workloads.iter().filter(|w| w.held_out).count();
            let counts = Counts {
                workloads: workloads.len(),
                held_out,
            };
            per_backend.insert(b.to_string(), counts);
        }
        Ok(TaskSummary {
            name: task.name().to_string(),
            kind: task.kind().to_string(),
            dir: task.dir().display().to_string(),
            description: spec.description.trim().to_string(),
            backends: task.backend_names().iter().map(|s| s.to_string()).collect(),
            workloads: spec.workloads.len(),
            held_out: spec.workloads.iter().filter(|w| w.held_out).count(),
            per_backend,
        })
    }

    /// The first line of the description.
    pub fn headline(&self) -> &str {
        self.description.lines().next().unwrap_or("")
    }

    /// The workloads per backend with the held-out ones in parentheses: `cpu 6 (3), cuda 9 (4)`.
    pub fn workloads_per_backend(&self) -> String {
        let parts: Vec<String> = self
            .per_backend
            .iter()
            .map(|(b, c)| format!("{b} {} ({})", c.workloads, c.held_out))
            .collect();
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_softmax_summary_counts_its_workloads_per_backend() {
        let task = crate::builtin::find("softmax").unwrap();
        let s = TaskSummary::of(&task).unwrap();
        assert_eq!((s.name.as_str(), s.kind.as_str()), ("softmax", "softmax"));
        assert_eq!(s.backends, ["cpu"]);
        let cpu = s.per_backend["cpu"];
        assert_eq!(cpu.workloads, task.workloads("cpu").unwrap().len());
        assert!(cpu.held_out > 0 && cpu.held_out < cpu.workloads);
        assert_eq!(
            s.workloads_per_backend(),
            format!("cpu {} ({})", cpu.workloads, cpu.held_out)
        );
        assert!(!s.headline().contains('\n'));
        assert!(s.description.starts_with(s.headline()));
    }
}
