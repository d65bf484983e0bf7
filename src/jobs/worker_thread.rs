//! The thread a remote worker's prepared job lives on (the Python API's `executor=`;
//! docs/scale-out.md). A worker's prepared state borrows its model, so it cannot be returned
//! to the caller: [`WorkerThread::start`] prepares it on a thread of its own, which answers
//! batches of candidates sent over a channel until the worker is dropped. Used by
//! [`super::search_worker::Worker`] (marked sets) and [`super::plan_worker::PlanWorker`]
//! (plan points).

use crate::error::{Error, Result};
use crate::search::Evaluation;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Mutex;
use std::thread::JoinHandle;

type Verdicts = Vec<Result<Evaluation>>;
/// The caller's ends: batches out, verdicts back.
type Channel<C> = (Sender<Vec<C>>, Receiver<Verdicts>);

/// The prepared side's end of the channels: [`Server::serve`] says the worker is ready and
/// answers batches.
pub struct Server<C> {
    ready: Sender<Result<()>>,
    batches: Receiver<Vec<C>>,
    verdicts: Sender<Verdicts>,
}

impl<C> Server<C> {
    /// Says the worker is ready, then judges batches with `judge` (one verdict per candidate,
    /// in order) until the worker is dropped.
    pub fn serve(&self, judge: &mut dyn FnMut(Vec<C>) -> Verdicts) -> Result<()> {
        if self.ready.send(Ok(())).is_err() {
            return Ok(());
        }
        for batch in self.batches.iter() {
            if self.verdicts.send(judge(batch)).is_err() {
                break;
            }
        }
        Ok(())
    }
}

/// A prepared job on its thread, answering batches of candidates `C`.
pub struct WorkerThread<C> {
    channel: Mutex<Option<Channel<C>>>,
    thread: Option<JoinHandle<()>>,
}

impl<C: Send + 'static> WorkerThread<C> {
    /// Runs `prepare` on a new thread named `name`: it loads and prepares the job, then calls
    /// [`Server::serve`] with its judge. Returns once the worker can judge, or the error that
    /// stopped `prepare`.
    pub fn start(
        name: &str,
        prepare: impl FnOnce(&Server<C>) -> Result<()> + Send + 'static,
    ) -> Result<WorkerThread<C>> {
        let (batches, batches_rx) = channel::<Vec<C>>();
        let (verdicts_tx, verdicts) = channel::<Verdicts>();
        let (ready_tx, ready) = channel::<Result<()>>();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let server = Server {
                    ready: ready_tx,
                    batches: batches_rx,
                    verdicts: verdicts_tx,
                };
                if let Err(e) = prepare(&server) {
                    let _ = server.ready.send(Err(e));
                }
            })
            .map_err(|e| Error::Invalid(format!("starting a worker: {e}")))?;
        match ready.recv() {
            Ok(Ok(())) => Ok(WorkerThread {
                channel: Mutex::new(Some((batches, verdicts))),
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(Error::Invalid(
                    "the worker stopped while preparing (an internal error)".into(),
                ))
            }
        }
    }

    /// Judges `batch`; one result per candidate, in order.
    pub fn evaluate_batch(&self, batch: Vec<C>) -> Verdicts {
        let n = batch.len();
        let lost = |n: usize| {
            (0..n)
                .map(|_| {
                    Err(Error::Invalid(
                        "the worker stopped (an internal error)".into(),
                    ))
                })
                .collect()
        };
        let guard = self.channel.lock().unwrap_or_else(|p| p.into_inner());
        let Some((batches, verdicts)) = guard.as_ref() else {
            return lost(n);
        };
        if batches.send(batch).is_err() {
            return lost(n);
        }
        verdicts.recv().unwrap_or_else(|_| lost(n))
    }
}

impl<C> Drop for WorkerThread<C> {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop.
        self.channel
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(passed: bool) -> Evaluation {
        Evaluation {
            passed,
            error: 0.0,
            summary: String::new(),
        }
    }

    #[test]
    fn a_worker_answers_batches_in_order_until_dropped() {
        // The prepared state borrows what the thread owns, as a worker's oracle does.
        let worker = WorkerThread::start("test-worker", |server: &Server<usize>| {
            let limit = vec![3usize];
            let limit = &limit;
            server.serve(&mut |batch| batch.iter().map(|&n| Ok(verdict(n < limit[0]))).collect())
        })
        .unwrap();
        let r = worker.evaluate_batch(vec![5, 1, 3, 2]);
        let passed: Vec<bool> = r.into_iter().map(|v| v.unwrap().passed).collect();
        assert_eq!(passed, vec![false, true, false, true]);
        assert!(worker.evaluate_batch(Vec::new()).is_empty());
    }

    #[test]
    fn a_worker_that_cannot_prepare_returns_its_error() {
        let e = WorkerThread::<usize>::start("test-worker", |_| {
            Err(Error::Invalid("no such model".into()))
        })
        .err()
        .unwrap();
        assert!(e.to_string().contains("no such model"), "{e}");
    }
}
