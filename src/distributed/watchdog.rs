//! A bound on how long a collective may wait: MPI's collectives have no timeout, so a rank
//! that stops answering (hung, not dead: a dead one ends the job through `mpirun`) would keep
//! every other rank waiting forever. While a collective runs, a watchdog thread holds its
//! deadline; past it, the process ends abnormally, which `mpirun` turns into the end of the
//! job with the rank named.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

#[derive(Default)]
struct State {
    /// The running collective's deadline and name.
    armed: Option<(Instant, String)>,
    stop: bool,
}

type Shared = Arc<(Mutex<State>, Condvar)>;

/// The watchdog of one rank's collectives.
pub(crate) struct Watchdog {
    shared: Shared,
    timeout: Duration,
}

impl Watchdog {
    /// Starts the thread.
    pub(crate) fn new(timeout: Duration, rank: usize) -> Watchdog {
        let shared: Shared = Arc::default();
        let watched = shared.clone();
        std::thread::Builder::new()
            .name("fusegraph-collective-watchdog".into())
            .spawn(move || watch(&watched, timeout, rank))
            .expect("a thread for the collective watchdog");
        Watchdog { shared, timeout }
    }

    /// Runs `f` (a collective named `what`) under the deadline.
    pub(crate) fn guard<R>(&self, what: &str, f: impl FnOnce() -> R) -> R {
        let (lock, cv) = &*self.shared;
        lock.lock().unwrap_or_else(PoisonError::into_inner).armed = Some((Instant::now() + self.timeout, what.into()));
        cv.notify_one();
        let r = f();
        lock.lock().unwrap_or_else(PoisonError::into_inner).armed = None;
        r
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let (lock, cv) = &*self.shared;
        lock.lock().unwrap_or_else(PoisonError::into_inner).stop = true;
        cv.notify_one();
    }
}

fn watch(shared: &Shared, timeout: Duration, rank: usize) {
    let (lock, cv) = &**shared;
    let mut st = lock.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        if st.stop {
            return;
        }
        let armed = st.armed.as_ref().map(|(d, w)| (*d, w.clone()));
        st = match armed {
            None => cv.wait(st).unwrap_or_else(PoisonError::into_inner),
            Some((deadline, what)) => {
                let now = Instant::now();
                if now >= deadline {
                    eprintln!(
                        "fusegraph: rank {rank}: {what} did not complete within {timeout:?} (another rank stopped \
                         answering); ending this process so that the job ends"
                    );
                    std::process::abort();
                }
                cv.wait_timeout(st, deadline - now).unwrap_or_else(PoisonError::into_inner).0
            }
        };
    }
}
