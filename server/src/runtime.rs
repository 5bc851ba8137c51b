//! The binary's async runtime: run the server on it, then stop it without waiting for work that never ends.
//!
//! Dropping a tokio runtime waits for every task on its blocking pool, and a file tool on that pool can be stuck in
//! the kernel (a hung network file system) for as long as it likes. So the runtime is shut down with a bound: past
//! it, such work is abandoned and the process exits. Tasks still alive at that point are dropped, which kills the
//! process trees of the commands they ran.

use std::future::Future;
use std::io;
use std::time::Duration;

/// How long, once the server has stopped, work left on the blocking pool may delay the exit.
pub const BLOCKING_WORK_PATIENCE: Duration = Duration::from_secs(1);

/// Runs `main` on a multi-threaded runtime, then stops the runtime, abandoning blocking work still running after
/// `patience`.
pub fn run<F: Future>(main: F, patience: Duration) -> io::Result<F::Output> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let output = runtime.block_on(main);
    runtime.shutdown_timeout(patience);
    Ok(output)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn blocking_work_that_never_ends_does_not_keep_the_process() {
        // A receive that never gets anything: the sender stays alive until the end of the test.
        let (_keep_open, never) = mpsc::channel::<()>();
        let (finished, outcome) = mpsc::channel();
        std::thread::spawn(move || {
            let output = run(
                async {
                    tokio::task::spawn_blocking(move || never.recv());
                    "served"
                },
                Duration::from_millis(100),
            );
            let _ = finished.send(output.map_err(|error| error.to_string()));
        });
        let output = outcome
            .recv_timeout(Duration::from_secs(5))
            .expect("the runtime did not stop: it waited for the blocking task");
        assert_eq!(output, Ok("served"));
    }
}
