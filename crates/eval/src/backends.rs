//! Which backend a run uses when none is named: the best one the task declares that this
//! machine can run, as the harness probe reports it.

use serde_json::Value;

use ksearch_task::Task;

use crate::{is_gpu_backend, EvalError, Evaluator, EvaluatorConfig};

/// The order backends are preferred in: a GPU backend first, else the CPU.
pub const PREFERENCE: [&str; 3] = ["cuda", "mlx", "cpu"];

/// Picks the backend for the task from what this machine can run, as the harness probe reports
/// it (`backends`: cpu always; cuda with PyTorch, nvcc and an NVIDIA GPU; mlx with MLX and a
/// GPU): a GPU backend first, else the CPU. `None` when the task declares no backend.
pub fn default_backend(task: &Task) -> Option<String> {
    pick_backend(&task.backend_names(), &probed_backends(), &PREFERENCE)
}

/// The backend `ksearch bench` measures: the one asked for (`asked`), which must be that of the
/// run whose kernel is benched (`of_run`), else the run's, else a GPU backend of the task that
/// this machine can run (cuda first).
pub fn bench_backend(
    task: &Task,
    asked: Option<&str>,
    of_run: Option<&str>,
) -> Result<String, EvalError> {
    match (asked, of_run) {
        (Some(b), Some(r)) if b != r => Err(EvalError::Bench(format!(
            "the run's kernel is for the {r} backend, not {b}"
        ))),
        (Some(b), _) | (None, Some(b)) => Ok(b.to_string()),
        (None, None) => {
            let names = task.backend_names();
            if !names.iter().any(|b| is_gpu_backend(b)) {
                return Err(EvalError::Bench(format!(
                    "task {} has no GPU backend; `ksearch bench` compares GPU kernels",
                    task.name()
                )));
            }
            pick_backend(&names, &probed_backends(), &["cuda", "mlx"]).ok_or_else(|| {
                EvalError::Bench("the task has no GPU backend this machine can run".into())
            })
        }
    }
}

/// The backends the harness says this machine can run; just `cpu` when the probe fails (the
/// evaluation that follows will say what is wrong with the set-up).
pub fn probed_backends() -> Vec<String> {
    let config = EvaluatorConfig {
        verify_harness: false,
        ..EvaluatorConfig::default()
    };
    let probe = Evaluator::new(config).and_then(|e| e.probe());
    match probe {
        Ok(v) => backends_of_probe(&v),
        Err(e) => {
            tracing::warn!("the harness probe failed, assuming only the cpu backend: {e}");
            vec!["cpu".to_string()]
        }
    }
}

/// `backends` of a probe answer (nested under `probe`, or flat).
pub fn backends_of_probe(answer: &Value) -> Vec<String> {
    let probe = answer.get("probe").unwrap_or(answer);
    let listed: Vec<String> = probe
        .get("backends")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|b| b.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    if listed.is_empty() {
        vec!["cpu".to_string()]
    } else {
        listed
    }
}

/// The first backend of `preference` that the task declares and the machine can run; else the
/// task's first backend in `preference`, else its first backend at all (so the error comes
/// from the evaluation, which names what is missing).
pub fn pick_backend(
    task_backends: &[&str],
    available: &[String],
    preference: &[&str],
) -> Option<String> {
    preference
        .iter()
        .find(|b| task_backends.contains(b) && available.iter().any(|a| a == *b))
        .or_else(|| preference.iter().find(|b| task_backends.contains(b)))
        .or(task_backends.first())
        .map(|b| b.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_bench_backend_is_the_asked_one_or_the_runs() {
        let attention = ksearch_task::resolve("attention").unwrap();
        let err = bench_backend(&attention, Some("mlx"), Some("cuda")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the run's kernel is for the cuda backend, not mlx"
        );
        assert_eq!(bench_backend(&attention, None, Some("mlx")).unwrap(), "mlx");
        assert_eq!(
            bench_backend(&attention, Some("cuda"), None).unwrap(),
            "cuda"
        );
        // A task without a GPU backend is refused before any probe.
        let softmax = ksearch_task::resolve("softmax").unwrap();
        let err = bench_backend(&softmax, None, None).unwrap_err();
        assert!(err.to_string().contains("has no GPU backend"), "{err}");
    }

    #[test]
    fn the_default_backend_is_the_first_gpu_backend_the_probe_lists() {
        let order = PREFERENCE;
        let avail =
            |names: &[&str]| -> Vec<String> { names.iter().map(|s| s.to_string()).collect() };
        let all = ["cpu", "cuda", "mlx"];
        assert_eq!(
            pick_backend(&all, &avail(&["cpu", "cuda", "mlx"]), &order).unwrap(),
            "cuda"
        );
        assert_eq!(
            pick_backend(&all, &avail(&["cpu", "mlx"]), &order).unwrap(),
            "mlx"
        );
        assert_eq!(pick_backend(&all, &avail(&["cpu"]), &order).unwrap(), "cpu");
        // A cpu-only task stays on cpu on a GPU machine.
        assert_eq!(
            pick_backend(&["cpu"], &avail(&["cpu", "cuda"]), &order).unwrap(),
            "cpu"
        );
        // Nothing runnable: the task's preferred backend, so the evaluation explains what is
        // missing.
        assert_eq!(
            pick_backend(&["mlx", "cuda"], &avail(&["cpu"]), &order).unwrap(),
            "cuda"
        );
        assert_eq!(
            pick_backend(&["tpu"], &avail(&["cpu"]), &order).unwrap(),
            "tpu"
        );
        assert!(pick_backend(&[], &avail(&["cpu"]), &order).is_none());
    }

    #[test]
    fn probe_answers_give_their_backend_list() {
        let nested = json!({"protocol": 1, "probe": {"backends": ["cpu", "cuda"]}});
        assert_eq!(backends_of_probe(&nested), ["cpu", "cuda"]);
        assert_eq!(
            backends_of_probe(&json!({"backends": ["cpu", "mlx"]})),
            ["cpu", "mlx"]
        );
        // An answer without the list (an old harness, an error string) means cpu only.
        assert_eq!(
            backends_of_probe(&json!({"probe": {"backends": "error: x"}})),
            ["cpu"]
        );
        assert_eq!(backends_of_probe(&json!({})), ["cpu"]);
    }
}
