//! The words a run's result is reported in (`run`, `show`, `export`): the re-measured comparison
//! with the seed leads, since both kernels were measured there under the same conditions, and a
//! ratio below one reads as "slower", never as "0.49x faster".

/// `ratio` is how many times the seed's time the kernel's time divides into (a ratio of
/// speedups over the same baseline): above one it is faster, below one slower.
pub fn versus_seed(ratio: f64) -> String {
    if !ratio.is_finite() || ratio <= 0.0 {
        return "not comparable with the seed".into();
    }
    if (ratio - 1.0).abs() < 0.005 {
        return "as fast as the seed".into();
    }
    if ratio > 1.0 {
        format!("{ratio:.2}x faster than the seed")
    } else {
        format!("{:.2}x slower than the seed", 1.0 / ratio)
    }
}

/// The re-measured comparison: `best` and `seed` are the two kernels' scores in the final
/// re-check (every workload, a fresh process and seed).
pub fn remeasured(best: f64, seed: f64) -> Option<String> {
    (seed > 0.0).then(|| {
        format!(
            "re-measured on all workloads: {} ({best:.3} vs the seed's {seed:.3})",
            versus_seed(best / seed)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_read_the_right_way_round() {
        assert_eq!(versus_seed(26.45), "26.45x faster than the seed");
        assert_eq!(versus_seed(0.49), "2.04x slower than the seed");
        assert_eq!(versus_seed(1.002), "as fast as the seed");
        assert_eq!(versus_seed(f64::NAN), "not comparable with the seed");
        assert_eq!(
            remeasured(1.5, 3.0).unwrap(),
            "re-measured on all workloads: 2.00x slower than the seed (1.500 vs the seed's 3.000)"
        );
        assert!(remeasured(1.0, 0.0).is_none());
    }
}
