//! The `time:` block of `ksearch show`: where a run's wall time went, as
//! [`crate::accounting`] reads it back from the store.

use std::fmt::Write as _;

use crate::accounting::{TimeAccount, TimeKind, WallEnd};

/// How many parts of the wall `show` lists before summing the rest.
const TIME_PARTS_SHOWN: usize = 8;

/// The `time:` block of `show`: wall, evaluations per hour, the device's busy fraction and the
/// largest parts of the wall (the accounting is [`crate::accounting`]'s).
pub fn render_time(t: &TimeAccount) -> String {
    let mut s = String::new();
    let wall = match (t.wall_seconds, t.wall_end) {
        (Some(w), WallEnd::Finished) => format!("wall {}", duration(w)),
        (Some(w), WallEnd::LastRecord) => {
            format!("wall {} (not finished: to the latest record)", duration(w))
        }
        (None, _) => "wall n/a (unreadable time stamps)".into(),
    };
    let n = t.evaluations.harness_runs();
    let per_hour = t
        .evaluations_per_hour
        .map(|r| {
            if r >= 100.0 {
                format!("{r:.0}")
            } else {
                format!("{r:.1}")
            }
        })
        .unwrap_or_else(|| "n/a".into());
    let busy = match (t.busy_fraction, t.device_seconds) {
        // The phases bound the device's work from above (accounting): "at most".
        (Some(f), Some(d)) => format!("≤ {:.1}% ({d:.1} s)", f * 100.0),
        _ => "n/a".into(),
    };
    let _ = writeln!(
        s,
        "\ntime: {wall} · {n} evaluations, {per_hour} per hour · device busy {busy}"
    );

    let e = &t.evaluations;
    if !e.in_events.is_empty() {
        let mut made = vec![format!("{} stored", e.stored)];
        made.extend(
            e.in_events
                .iter()
                .map(|(kind, k)| format!("{k} in {kind} events")),
        );
        let _ = writeln!(s, "  evaluations: {}", made.join(" + "));
    }
    if let Some(typ) = &t.typical_evaluation {
        let _ = writeln!(
            s,
            "  typical evaluation (median of {} stored): {:.2} s, device work ≤ {:.1}% of it",
            typ.count,
            typ.median_seconds,
            typ.median_device_share * 100.0
        );
    }
    let mut notes = Vec::new();
    if t.yardsticks > 0 {
        let plural = if t.yardsticks == 1 { "" } else { "s" };
        notes.push(format!("{} yardstick{plural} measured", t.yardsticks));
    }
    if e.profiled > 0 {
        let plural = if e.profiled == 1 { "" } else { "s" };
        let spent = t.part_seconds(crate::accounting::PROFILER);
        let ahead = match e.profiled_ahead {
            0 => String::new(),
            k => format!(" ({k} by a profiler started ahead)"),
        };
        notes.push(format!(
            "{} new best{plural} profiled in {spent:.1} s{ahead}",
            e.profiled
        ));
    }
    if e.in_lanes > 0 {
        let gate = t.part_seconds(crate::accounting::GATE);
        let busy = match e.busy_when_timed {
            0 => String::new(),
            k => format!(", {k} timed while other work still ran on the device"),
        };
        notes.push(format!(
            "{} judged in up to {} lanes, {gate:.1} s waiting at the device gate{busy}",
            e.in_lanes, e.lanes
        ));
    }
    if e.reused + e.lint_rejected > 0 {
        notes.push(format!(
            "{} reused and {} lint-rejected results ran no harness",
            e.reused, e.lint_rejected
        ));
    }
    if !notes.is_empty() {
        let _ = writeln!(s, "  {}", notes.join("; "));
    }
    if let Some(b) = &t.builds_ahead {
        let _ = writeln!(
            s,
            "  builds written ahead: {} taken, {} waited for; compile {:.1} s (median, at most \
             {:.1} s), started {:.1} s (median) before their evaluation asked",
            b.taken,
            b.waited_for,
            b.compile_median_seconds,
            b.compile_max_seconds,
            b.head_start_median_seconds
        );
    }
    if !t.profile_steps.is_empty() {
        // In the order the profiled process takes them; any other step after them.
        const ORDER: [&str; 5] = ["device", "wait", "load", "inputs", "calls"];
        let mut steps: Vec<(&String, &f64)> = t.profile_steps.iter().collect();
        steps.sort_by_key(|(step, _)| ORDER.iter().position(|o| o == step).unwrap_or(ORDER.len()));
        let steps: Vec<String> = steps
            .into_iter()
            .map(|(step, secs)| format!("{step} {secs:.1}"))
            .collect();
        let _ = writeln!(
            s,
            "  profiled processes' own steps, seconds: {} (the rest of the profiler's: its and \
             the interpreter's start and end)",
            steps.join(" · ")
        );
    }
    if e.unsteady_repeats > 0 {
        let _ = writeln!(
            s,
            "  {} evaluations repeated after an unsteady first try",
            e.unsteady_repeats
        );
    }
    if e.unsteady_kept > 0 {
        let _ = writeln!(
            s,
            "  {} unsteady evaluations kept as measured (repeats had come out as unsteady)",
            e.unsteady_kept
        );
    }

    if t.parts.iter().all(|p| p.kind == TimeKind::Other) {
        let _ = writeln!(s, "  no phase times recorded (results of an older ksearch)");
        return s;
    }
    let share = |secs: f64| {
        t.share(secs)
            .map(|f| format!("{:.1}%", f * 100.0))
            .unwrap_or_else(|| "-".into())
    };
    let _ = writeln!(
        s,
        "  {:<24} {:>9} {:>6}",
        "where it went", "seconds", "share"
    );
    for p in t.parts.iter().take(TIME_PARTS_SHOWN) {
        let mark = if p.kind == TimeKind::Device { " *" } else { "" };
        let name = format!("{}{mark}", p.name);
        let _ = writeln!(s, "  {name:<24} {:>9.1} {:>6}", p.seconds, share(p.seconds));
    }
    let rest = &t.parts[t.parts.len().min(TIME_PARTS_SHOWN)..];
    if !rest.is_empty() {
        let secs: f64 = rest.iter().map(|p| p.seconds).sum();
        let name = format!("{} more", rest.len());
        let _ = writeln!(s, "  {name:<24} {secs:>9.1} {:>6}", share(secs));
    }
    if t.overlap_seconds > 0.0 {
        let _ = writeln!(
            s,
            "  (the parts exceed the wall by {:.1} s: work overlapped)",
            t.overlap_seconds
        );
    }
    let _ = writeln!(
        s,
        "  * device work (its sum over the wall is the busy fraction)"
    );
    s
}

/// `42.1 s`, `4 min 10 s`, `2 h 05 min`.
fn duration(secs: f64) -> String {
    if secs < 60.0 {
        return format!("{secs:.1} s");
    }
    let whole = secs.round() as u64;
    if whole < 3600 {
        format!("{} min {:02} s", whole / 60, whole % 60)
    } else {
        format!("{} h {:02} min", whole / 3600, whole % 3600 / 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounting::{EvaluationCounts, TimePart};

    fn part(name: &str, seconds: f64, kind: TimeKind) -> TimePart {
        TimePart {
            name: name.into(),
            seconds,
            kind,
        }
    }

    #[test]
    fn the_time_block_of_a_finished_run() {
        let parts = vec![
            part("other", 88.9, TimeKind::Other),
            part("timed_calls", 33.6, TimeKind::Device),
            part("yardstick", 26.6, TimeKind::Device),
            part("flush", 21.4, TimeKind::Device),
            part("settle", 13.8, TimeKind::Harness),
            part("candidate", 12.4, TimeKind::Device),
            part("harness start/exit", 11.8, TimeKind::Harness),
            part("inputs", 11.3, TimeKind::Harness),
            part("load", 7.6, TimeKind::Harness),
            part("reference", 7.4, TimeKind::Device),
            part("profiler", 5.2, TimeKind::Harness),
        ];
        let t = TimeAccount {
            wall_seconds: Some(250.266),
            wall_end: WallEnd::Finished,
            evaluations: EvaluationCounts {
                stored: 23,
                in_events: [("confirmation".into(), 8), ("remeasure".into(), 4)].into(),
                with_phases: 35,
                reused: 2,
                lint_rejected: 1,
                unsteady_repeats: 11,
                unsteady_kept: 4,
                profiled: 3,
                profiled_ahead: 2,
                ..EvaluationCounts::default()
            },
            evaluations_per_hour: Some(35.0 * 3600.0 / 250.266),
            yardsticks: 12,
            parts,
            device_seconds: Some(101.4),
            busy_fraction: Some(101.4 / 250.266),
            overlap_seconds: 0.0,
            builds_ahead: Some(crate::accounting::AheadBuilds {
                taken: 20,
                waited_for: 8,
                compile_median_seconds: 6.14,
                compile_max_seconds: 9.02,
                head_start_median_seconds: 3.41,
            }),
            typical_evaluation: Some(crate::accounting::TypicalEvaluation {
                count: 23,
                median_seconds: 1.514,
                median_device_share: 0.288,
            }),
            profile_steps: [
                ("calls".to_string(), 1.2),
                ("device".to_string(), 4.1),
                ("inputs".to_string(), 0.6),
                ("load".to_string(), 0.2),
                ("wait".to_string(), 0.0),
            ]
            .into(),
        };
        insta::assert_snapshot!(render_time(&t));
    }

    #[test]
    fn the_time_block_of_an_old_unfinished_run() {
        let t = TimeAccount {
            wall_seconds: Some(4000.0),
            wall_end: WallEnd::LastRecord,
            evaluations: EvaluationCounts {
                stored: 3,
                ..EvaluationCounts::default()
            },
            evaluations_per_hour: Some(2.7),
            yardsticks: 0,
            parts: vec![part("other", 4000.0, TimeKind::Other)],
            device_seconds: None,
            busy_fraction: None,
            overlap_seconds: 0.0,
            builds_ahead: None,
            typical_evaluation: None,
            profile_steps: Default::default(),
        };
        insta::assert_snapshot!(render_time(&t));
    }

    #[test]
    fn evaluations_in_lanes_say_how_many_lanes_and_what_they_waited() {
        let t = TimeAccount {
            wall_seconds: Some(100.0),
            wall_end: WallEnd::Finished,
            evaluations: EvaluationCounts {
                stored: 20,
                with_phases: 20,
                in_lanes: 18,
                lanes: 2,
                busy_when_timed: 1,
                ..EvaluationCounts::default()
            },
            evaluations_per_hour: Some(720.0),
            yardsticks: 1,
            parts: vec![
                part("candidate", 30.0, TimeKind::Device),
                part("gate", 6.5, TimeKind::Harness),
                part("other", 63.5, TimeKind::Other),
            ],
            device_seconds: Some(30.0),
            busy_fraction: Some(0.3),
            overlap_seconds: 0.0,
            builds_ahead: None,
            typical_evaluation: None,
            profile_steps: Default::default(),
        };
        let text = render_time(&t);
        assert!(
            text.contains(
                "18 judged in up to 2 lanes, 6.5 s waiting at the device gate, 1 timed while \
                 other work still ran on the device"
            ),
            "{text}"
        );
        let one_lane = TimeAccount {
            evaluations: EvaluationCounts {
                stored: 20,
                ..EvaluationCounts::default()
            },
            ..t
        };
        assert!(!render_time(&one_lane).contains("lanes"));
    }

    #[test]
    fn durations_read_as_seconds_minutes_or_hours() {
        assert_eq!(duration(0.04), "0.0 s");
        assert_eq!(duration(59.94), "59.9 s");
        assert_eq!(duration(250.27), "4 min 10 s");
        assert_eq!(duration(3600.0), "1 h 00 min");
        assert_eq!(duration(7385.0), "2 h 03 min");
    }
}
