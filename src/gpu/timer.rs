//! GPU time per stage from timestamp queries: each recorded compute pass writes a timestamp at
//! its start and end; after the submission the pairs are resolved, read back and summed by
//! stage label. Only where the adapter has `TIMESTAMP_QUERY`.

use super::{Context, Readback};
use crate::error::Result;

/// Timestamp pairs of one submission, labelled by stage.
pub struct Timer {
    set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    capacity: u32,
    labels: Vec<&'static str>,
}

impl Timer {
    /// A timer for up to `passes` passes per submission; `None` without timestamp queries.
    pub fn new(ctx: &Context, passes: u32) -> Option<Timer> {
        if !ctx.caps.timestamps {
            return None;
        }
        let capacity = passes.clamp(1, 2048) * 2;
        let set = ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("qsa.timer"),
            ty: wgpu::QueryType::Timestamp,
            count: capacity,
        });
        let resolve = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("qsa.timer.resolve"),
            size: capacity as u64 * 8,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        Some(Timer {
            set,
            resolve,
            capacity,
            labels: Vec::new(),
        })
    }

    /// Forgets the passes of the previous submission.
    pub fn clear(&mut self) {
        self.labels.clear();
    }

    /// The timestamp writes for the next pass of stage `label` (`None` once full).
    pub fn writes(&mut self, label: &'static str) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        let i = self.labels.len() as u32 * 2;
        if i + 2 > self.capacity {
            return None;
        }
        self.labels.push(label);
        Some(wgpu::ComputePassTimestampWrites {
            query_set: &self.set,
            beginning_of_pass_write_index: Some(i),
            end_of_pass_write_index: Some(i + 1),
        })
    }

    /// Opens a span of stage `label` around passes recorded by someone else: an empty pass
    /// that writes the start timestamp; [`Timer::end_span`] writes the end.
    pub fn begin_span(&mut self, enc: &mut wgpu::CommandEncoder, label: &'static str) {
        let i = self.labels.len() as u32 * 2;
        if i + 2 > self.capacity {
            return;
        }
        self.labels.push(label);
        enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("qsa.timer.begin"),
            timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                query_set: &self.set,
                beginning_of_pass_write_index: Some(i),
                end_of_pass_write_index: None,
            }),
        });
    }

    /// Closes the span opened last by [`Timer::begin_span`].
    pub fn end_span(&self, enc: &mut wgpu::CommandEncoder) {
        let Some(last) = (self.labels.len() as u32).checked_sub(1) else {
            return;
        };
        enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("qsa.timer.end"),
            timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                query_set: &self.set,
                beginning_of_pass_write_index: None,
                end_of_pass_write_index: Some(2 * last + 1),
            }),
        });
    }

    /// Records the resolve of this submission's timestamps (call before submitting).
    pub fn resolve(&self, enc: &mut wgpu::CommandEncoder) {
        let n = self.labels.len() as u32 * 2;
        if n > 0 {
            enc.resolve_query_set(&self.set, 0..n, &self.resolve, 0);
        }
    }

    /// Milliseconds per stage label, in first-seen order (after the submission).
    pub async fn read(&self, ctx: &Context) -> Result<Vec<(&'static str, f64)>> {
        let n = self.labels.len() as u64 * 2;
        if n == 0 {
            return Ok(Vec::new());
        }
        let bytes = Readback::new(ctx, &[(&self.resolve, n * 8)])
            .await_all(ctx)
            .await?
            .remove(0);
        let ticks: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let period = ctx.queue.get_timestamp_period() as f64;
        let mut out: Vec<(&'static str, f64)> = Vec::new();
        for (i, label) in self.labels.iter().enumerate() {
            let ms = ticks[2 * i + 1].saturating_sub(ticks[2 * i]) as f64 * period / 1e6;
            match out.iter_mut().find(|(l, _)| l == label) {
                Some(e) => e.1 += ms,
                None => out.push((label, ms)),
            }
        }
        Ok(out)
    }
}
