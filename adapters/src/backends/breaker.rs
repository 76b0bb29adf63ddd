//! One circuit breaker per backend, as fred's (sony/gobreaker with fred's settings): closed
//! until 5 failures in a row, then open for 60 s (every call refused at once), then half-open:
//! one trial call; its success closes the breaker, its failure opens it again. Which answers
//! are failures is [`super::BackendError::counts_toward_breaker`], plus every transport error.
//! Pure: the caller hands in the time (from its `Clock`), so tests drive it with no waiting.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use chrono::{DateTime, TimeDelta, Utc};

/// Failures in a row that open the breaker.
pub const BREAKER_FAILURES_MAX: u32 = 5;

/// How long it stays open before admitting a trial call.
pub const BREAKER_OPEN: TimeDelta = TimeDelta::seconds(60);

/// Where a breaker stands (the numbers are fred's gauge values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go through.
    Closed = 0,
    /// One trial call goes through.
    HalfOpen = 1,
    /// Calls are refused.
    Open = 2,
}

/// A call the breaker let through; hand it back with the call's result. Results of calls let
/// through before the breaker last changed state are ignored, as gobreaker ignores them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "record the call's result"]
pub struct Admission {
    generation: u64,
}

/// The breaker refused the call: the backend failed too often lately. Transient.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the backend's circuit is open")]
pub struct CircuitOpen;

/// One backend's breaker.
#[derive(Debug, Clone)]
pub struct Breaker {
    state: BreakerState,
    failures: u32,
    opened_at: DateTime<Utc>,
    trial_out: bool,
    generation: u64,
    open_for: TimeDelta,
}

impl Default for Breaker {
    fn default() -> Self {
        Self::opening_for(BREAKER_OPEN)
    }
}

impl Breaker {
    /// A closed breaker that stays open for `open_for` once it opens (fred's is 60 s).
    pub fn opening_for(open_for: TimeDelta) -> Self {
        Self {
            state: BreakerState::Closed,
            failures: 0,
            opened_at: DateTime::<Utc>::MIN_UTC,
            trial_out: false,
            generation: 0,
            open_for,
        }
    }

    /// Where it stands at `now` (an open breaker whose time is up is half-open).
    pub fn state(&self, now: DateTime<Utc>) -> BreakerState {
        match self.state {
            BreakerState::Open if now - self.opened_at >= self.open_for => BreakerState::HalfOpen,
            state => state,
        }
    }

    /// Lets a call through at `now`, or refuses it.
    ///
    /// # Errors
    /// [`CircuitOpen`] while open, and while a half-open trial is out.
    pub fn admit(&mut self, now: DateTime<Utc>) -> Result<Admission, CircuitOpen> {
        if self.state == BreakerState::Open && self.state(now) == BreakerState::HalfOpen {
            self.enter(BreakerState::HalfOpen, now);
        }
        match self.state {
            BreakerState::Closed => {}
            BreakerState::Open => return Err(CircuitOpen),
            BreakerState::HalfOpen if self.trial_out => return Err(CircuitOpen),
            BreakerState::HalfOpen => self.trial_out = true,
        }
        Ok(Admission { generation: self.generation })
    }

    /// Records the result of an admitted call: `failed` if it counts toward the breaker.
    pub fn record(&mut self, admission: Admission, failed: bool, now: DateTime<Utc>) {
        if admission.generation != self.generation {
            return;
        }
        match (self.state, failed) {
            (BreakerState::Closed, false) => self.failures = 0,
            (BreakerState::Closed, true) => {
                self.failures += 1;
                if self.failures >= BREAKER_FAILURES_MAX {
                    self.enter(BreakerState::Open, now);
                }
            }
            (BreakerState::HalfOpen, false) => self.enter(BreakerState::Closed, now),
            (BreakerState::HalfOpen, true) => self.enter(BreakerState::Open, now),
            (BreakerState::Open, _) => {}
        }
    }

    fn enter(&mut self, state: BreakerState, now: DateTime<Utc>) {
        if self.state != state {
            tracing::info!(from = ?self.state, to = ?state, "backend circuit breaker");
        }
        self.state = state;
        self.failures = 0;
        self.trial_out = false;
        self.generation += 1;
        if state == BreakerState::Open {
            self.opened_at = now;
        }
    }
}

/// A breaker shared by every call to one backend.
#[derive(Debug, Clone, Default)]
pub struct SharedBreaker(Arc<Mutex<Breaker>>);

impl SharedBreaker {
    /// A shared [`Breaker::opening_for`].
    pub fn opening_for(open_for: TimeDelta) -> Self {
        Self(Arc::new(Mutex::new(Breaker::opening_for(open_for))))
    }

    fn lock(&self) -> MutexGuard<'_, Breaker> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Where it stands at `now`.
    pub fn state(&self, now: DateTime<Utc>) -> BreakerState {
        self.lock().state(now)
    }

    /// Lets a call through at `now`, or refuses it.
    ///
    /// # Errors
    /// [`CircuitOpen`], as [`Breaker::admit`].
    pub fn admit(&self, now: DateTime<Utc>) -> Result<Call, CircuitOpen> {
        let admission = self.lock().admit(now)?;
        Ok(Call { breaker: self.clone(), admission: Some(admission), admitted_at: now })
    }
}

/// A call the shared breaker let through. Record its result; dropped unrecorded (the
/// caller's future was cancelled, by a timeout or a shutdown) it counts as a failure, so a
/// half-open trial is never left out for ever with every later call refused.
#[derive(Debug)]
#[must_use = "record the call's result"]
pub struct Call {
    breaker: SharedBreaker,
    admission: Option<Admission>,
    admitted_at: DateTime<Utc>,
}

impl Call {
    /// Records the call's result at `now`.
    pub fn record(mut self, failed: bool, now: DateTime<Utc>) {
        if let Some(admission) = self.admission.take() {
            self.breaker.lock().record(admission, failed, now);
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        if let Some(admission) = self.admission.take() {
            self.breaker.lock().record(admission, true, self.admitted_at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + seconds, 0).expect("a time")
    }

    fn call(breaker: &mut Breaker, at: i64, failed: bool) -> Result<(), CircuitOpen> {
        let admission = breaker.admit(t(at))?;
        breaker.record(admission, failed, t(at));
        Ok(())
    }

    #[test]
    fn five_failures_in_a_row_open_it_for_sixty_seconds_then_one_trial_decides() {
        let mut breaker = Breaker::default();
        for _ in 0..4 {
            call(&mut breaker, 0, true).unwrap();
        }
        // A success resets the run: four more failures still leave it closed.
        call(&mut breaker, 0, false).unwrap();
        for _ in 0..4 {
            call(&mut breaker, 0, true).unwrap();
        }
        assert_eq!(breaker.state(t(0)), BreakerState::Closed);
        call(&mut breaker, 1, true).unwrap();
        assert_eq!(breaker.state(t(1)), BreakerState::Open);
        assert_eq!(breaker.admit(t(60)), Err(CircuitOpen), "59 s after opening");

        // 60 s on: one trial, and no second call while it is out.
        assert_eq!(breaker.state(t(61)), BreakerState::HalfOpen);
        let trial = breaker.admit(t(61)).expect("the trial");
        assert_eq!(breaker.admit(t(61)), Err(CircuitOpen));
        // The trial fails: open again for another 60 s.
        breaker.record(trial, true, t(62));
        assert_eq!(breaker.admit(t(121)), Err(CircuitOpen));
        let trial = breaker.admit(t(122)).expect("the next trial");
        breaker.record(trial, false, t(122));
        assert_eq!(breaker.state(t(122)), BreakerState::Closed);
        call(&mut breaker, 123, false).unwrap();
    }

    #[test]
    fn a_result_from_before_the_last_change_is_ignored() {
        let mut breaker = Breaker::default();
        let slow = breaker.admit(t(0)).expect("closed");
        for _ in 0..5 {
            call(&mut breaker, 0, true).unwrap();
        }
        // A call let through while closed ends after the breaker opened: its success does
        // not close it.
        breaker.record(slow, false, t(1));
        assert_eq!(breaker.state(t(1)), BreakerState::Open);
        assert_eq!(BreakerState::HalfOpen as u8, 1);
    }

    #[test]
    fn a_trial_dropped_unrecorded_counts_as_failed_and_the_next_one_is_admitted() {
        let breaker = SharedBreaker::default();
        for _ in 0..5 {
            breaker.admit(t(0)).expect("closed").record(true, t(0));
        }
        let trial = breaker.admit(t(60)).expect("half-open: the trial");
        // The caller gave up on it (its future was dropped).
        drop(trial);
        assert_eq!(breaker.state(t(61)), BreakerState::Open, "not stuck half-open");
        assert_eq!(breaker.admit(t(100)).err(), Some(CircuitOpen));
        let trial = breaker.admit(t(120)).expect("another trial 60 s on");
        trial.record(false, t(120));
        assert_eq!(breaker.state(t(120)), BreakerState::Closed);
    }
}
