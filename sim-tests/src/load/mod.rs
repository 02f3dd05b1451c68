//! Load evaluation: k6-style constant-arrival-rate scenarios against the tree
//! service (issue 6).
//!
//! The generator ([`driver`]) only sees a [`target::Target`] (something that
//! answers a `Request` with a `Response`) and the engine's `Clock`/`Runtime`
//! traits. Real mode plugs in wall time, tokio and real redb files; sim mode
//! plugs in madsim time and the simulated cluster. Everything downstream of
//! the generator (histograms, summary, JSON, HTML, matrix) is shared.

pub mod calibrate;
pub mod cli;
pub mod cpu;
pub mod driver;
pub mod gateway;
pub mod grpc;
pub mod html;
pub mod matrix;
pub mod metrics;
pub mod node_timeline;
pub mod real;
pub mod report;
pub mod scenario;
pub mod sim_mode;
pub mod target;
pub mod threshold;
