//! A counting semaphore on std primitives, for the in-flight call limit.

use std::sync::{Condvar, Mutex};

pub(crate) struct Semaphore {
    in_use: Mutex<usize>,
    freed: Condvar,
    limit: usize,
}

pub(crate) struct Permit<'a> {
    sem: &'a Semaphore,
}

impl Semaphore {
    /// `limit` is raised to 1: a limit of 0 would block every call forever.
    pub fn new(limit: usize) -> Self {
        Semaphore {
            in_use: Mutex::new(0),
            freed: Condvar::new(),
            limit: limit.max(1),
        }
    }

    pub fn acquire(&self) -> Permit<'_> {
        // Poisoning can only come from a panic while holding this lock, which
        // does nothing but arithmetic; the count is still right.
        let mut n = self.in_use.lock().unwrap_or_else(|p| p.into_inner());
        while *n >= self.limit {
            n = self.freed.wait(n).unwrap_or_else(|p| p.into_inner());
        }
        *n += 1;
        Permit { sem: self }
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        let mut n = self.sem.in_use.lock().unwrap_or_else(|p| p.into_inner());
        *n -= 1;
        self.sem.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn never_more_than_limit_holders() {
        let sem = Arc::new(Semaphore::new(3));
        let now = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..12)
            .map(|_| {
                let (sem, now, peak) = (sem.clone(), now.clone(), peak.clone());
                std::thread::spawn(move || {
                    let _p = sem.acquire();
                    let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(n, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(5));
                    now.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert!(peak.load(Ordering::SeqCst) <= 3);
        assert!(peak.load(Ordering::SeqCst) >= 2, "threads never overlapped");
    }
}
