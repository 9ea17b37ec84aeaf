//! `record_metrics` (feature `metrics`) publishes `stats()` through the `metrics`
//! facade: run with `cargo test --features metrics --test metrics`.

#![cfg(feature = "metrics")]

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use support::{small_timer, wait_until, WAIT};

/// The last value of each counter and gauge, and every histogram sample, by name
/// (labels appended as `{k=v}`).
#[derive(Debug, Default)]
struct Readings {
    values: HashMap<String, f64>,
    samples: HashMap<String, Vec<f64>>,
    /// Each described series: its kind, unit and help text.
    described: HashMap<String, (&'static str, Option<Unit>, String)>,
}

/// One metric of the test recorder.
#[derive(Debug)]
struct Metric {
    name: String,
    readings: Arc<Mutex<Readings>>,
}

impl Metric {
    fn set(&self, value: f64) {
        self.readings
            .lock()
            .unwrap()
            .values
            .insert(self.name.clone(), value);
    }
}

impl CounterFn for Metric {
    fn increment(&self, value: u64) {
        let mut readings = self.readings.lock().unwrap();
        *readings.values.entry(self.name.clone()).or_default() += value as f64;
    }
    fn absolute(&self, value: u64) {
        self.set(value as f64);
    }
}

impl GaugeFn for Metric {
    fn increment(&self, value: f64) {
        *self
            .readings
            .lock()
            .unwrap()
            .values
            .entry(self.name.clone())
            .or_default() += value;
    }
    fn decrement(&self, value: f64) {
        GaugeFn::increment(self, -value);
    }
    fn set(&self, value: f64) {
        Metric::set(self, value);
    }
}

impl HistogramFn for Metric {
    fn record(&self, value: f64) {
        self.readings
            .lock()
            .unwrap()
            .samples
            .entry(self.name.clone())
            .or_default()
            .push(value);
    }
}

/// A recorder that keeps everything in memory.
#[derive(Debug, Default)]
struct TestRecorder {
    readings: Arc<Mutex<Readings>>,
}

impl TestRecorder {
    fn metric(&self, key: &Key) -> Arc<Metric> {
        let mut name = key.name().to_owned();
        for label in key.labels() {
            name.push_str(&format!("{{{}={}}}", label.key(), label.value()));
        }
        Arc::new(Metric {
            name,
            readings: self.readings.clone(),
        })
    }
    fn describe(&self, kind: &'static str, name: KeyName, unit: Option<Unit>, help: SharedString) {
        self.readings
            .lock()
            .unwrap()
            .described
            .insert(name.as_str().to_owned(), (kind, unit, help.to_string()));
    }
    fn value(&self, name: &str) -> Option<f64> {
        self.readings.lock().unwrap().values.get(name).copied()
    }
    fn samples(&self, name: &str) -> Vec<f64> {
        self.readings
            .lock()
            .unwrap()
            .samples
            .get(name)
            .cloned()
            .unwrap_or_default()
    }
}

impl Recorder for TestRecorder {
    fn describe_counter(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
        self.describe("counter", name, unit, help);
    }
    fn describe_gauge(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
        self.describe("gauge", name, unit, help);
    }
    fn describe_histogram(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
        self.describe("histogram", name, unit, help);
    }
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.metric(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.metric(key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.metric(key))
    }
}

#[test]
fn record_metrics_exports_counters_gauges_and_each_fired_timer_once() {
    let recorder = TestRecorder::default();
    let timer = small_timer();
    let _pending: Vec<_> = (0..50)
        .map(|_| timer.schedule(Duration::from_secs(3600), || {}).unwrap())
        .collect();
    for _ in 0..100 {
        timer.schedule(Duration::from_millis(1), || {}).unwrap();
    }
    assert!(wait_until(WAIT, || {
        let stats = timer.stats();
        stats.fired == 100 && stats.scheduled == 150
    }));
    metrics::with_local_recorder(&recorder, || timer.record_metrics());
    assert_eq!(recorder.value("sharded_timer_scheduled_total"), Some(150.0));
    assert_eq!(recorder.value("sharded_timer_fired_total"), Some(100.0));
    assert_eq!(recorder.value("sharded_timer_cancelled_total"), Some(0.0));
    assert_eq!(recorder.value("sharded_timer_panicked_total"), Some(0.0));
    assert_eq!(
        recorder.value("sharded_timer_ring_full_waits_total"),
        Some(0.0)
    );
    assert_eq!(recorder.value("sharded_timer_pending"), Some(50.0));
    assert_eq!(recorder.value("sharded_timer_in_rings"), Some(0.0));
    let per_shard = recorder
        .value("sharded_timer_shard_pending{shard=0}")
        .unwrap()
        + recorder
            .value("sharded_timer_shard_pending{shard=1}")
            .unwrap();
    assert_eq!(per_shard, 50.0);
    let lateness = recorder.samples("sharded_timer_lateness_seconds");
    assert_eq!(lateness.len(), 100, "one sample per fired timer");
    assert!(
        lateness.iter().all(|&s| (0.0..5.0).contains(&s)),
        "{lateness:?}"
    );

    // Every series is described, with its unit and a help text; counters end in
    // `_total`, as Prometheus expects.
    let described = recorder.readings.lock().unwrap().described.clone();
    let series: Vec<String> = {
        let readings = recorder.readings.lock().unwrap();
        readings
            .values
            .keys()
            .chain(readings.samples.keys())
            .map(|name| name.split('{').next().unwrap().to_owned())
            .collect()
    };
    for name in &series {
        let (kind, unit, help) = described
            .get(name)
            .unwrap_or_else(|| panic!("{name} is described"));
        assert!(
            unit.is_some() && !help.is_empty(),
            "{name}: {unit:?} {help:?}"
        );
        assert_eq!(
            *kind == "counter",
            name.ends_with("_total"),
            "{name} is a {kind}"
        );
    }
    assert_eq!(described.len(), 10, "{described:?}");
    assert_eq!(
        described["sharded_timer_lateness_seconds"].1,
        Some(Unit::Seconds)
    );

    // A second export adds only the timers fired since.
    for _ in 0..10 {
        timer.schedule(Duration::ZERO, || {}).unwrap();
    }
    assert!(wait_until(WAIT, || timer.stats().fired == 110));
    metrics::with_local_recorder(&recorder, || timer.record_metrics());
    assert_eq!(recorder.value("sharded_timer_fired_total"), Some(110.0));
    assert_eq!(
        recorder.samples("sharded_timer_lateness_seconds").len(),
        110
    );
}
