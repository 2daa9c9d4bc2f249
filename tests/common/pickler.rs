//! A small pickle writer for hostile snapshots made by the tests themselves:
//! protocol 4 opcodes written by hand, with the memo as PyTorch's pickler
//! uses it (shared frame dicts referenced by index).

pub struct Pickler {
    pub out: Vec<u8>,
    memo: u32,
}

impl Default for Pickler {
    fn default() -> Self {
        Pickler { out: vec![0x80, 0x04], memo: 0 }
    }
}

impl Pickler {
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.out.push(b'X');
        self.out.extend((s.len() as u32).to_le_bytes());
        self.out.extend(s.as_bytes());
        self
    }
    pub fn int(&mut self, n: u64) -> &mut Self {
        if n < 1 << 31 {
            self.out.push(b'J');
            self.out.extend((n as i32).to_le_bytes());
        } else {
            self.out.extend([0x8a, 9]);
            self.out.extend(n.to_le_bytes());
            self.out.push(0);
        }
        self
    }
    pub fn bool(&mut self, b: bool) -> &mut Self {
        self.out.push(if b { 0x88 } else { 0x89 });
        self
    }
    /// Stores the value on top of the stack in the next memo slot.
    pub fn memoize(&mut self) -> u32 {
        self.out.push(0x94);
        self.memo += 1;
        self.memo - 1
    }
    pub fn get(&mut self, slot: u32) -> &mut Self {
        self.out.push(b'j');
        self.out.extend(slot.to_le_bytes());
        self
    }
    /// A dict of `f`'s key/value pairs.
    pub fn dict(&mut self, f: impl FnOnce(&mut Self)) -> &mut Self {
        self.out.extend([b'}', b'(']);
        f(self);
        self.out.push(b'u');
        self
    }
    /// A list of `f`'s values.
    pub fn list(&mut self, f: impl FnOnce(&mut Self)) -> &mut Self {
        self.out.extend([b']', b'(']);
        f(self);
        self.out.push(b'e');
        self
    }
    pub fn tuple2(&mut self, a: u64, b: u64) -> &mut Self {
        self.int(a).int(b);
        self.out.push(0x86);
        self
    }
    /// `"key": value` inside a dict.
    pub fn kv(&mut self, k: &str, v: impl FnOnce(&mut Self)) -> &mut Self {
        self.str(k);
        v(self);
        self
    }
    pub fn finish(mut self) -> Vec<u8> {
        self.out.push(b'.');
        self.out
    }
}

/// A trace entry `{action, addr, size, stream, time_us, frames}`; `frames`
/// writes the frames list's items.
pub fn entry(p: &mut Pickler, action: &str, addr: u64, size: u64, stream: u64, frames: impl FnOnce(&mut Pickler)) {
    entry_at(p, 0, action, addr, size, stream, frames)
}

/// `entry` at `time_us`.
pub fn entry_at(
    p: &mut Pickler,
    time_us: u64,
    action: &str,
    addr: u64,
    size: u64,
    stream: u64,
    frames: impl FnOnce(&mut Pickler),
) {
    p.dict(|p| {
        p.kv("action", |p| {
            p.str(action);
        })
        .kv("addr", |p| {
            p.int(addr);
        })
        .kv("size", |p| {
            p.int(size);
        })
        .kv("stream", |p| {
            p.int(stream);
        })
        .kv("time_us", |p| {
            p.int(time_us);
        })
        .kv("frames", |p| {
            p.list(frames);
        });
    });
}

/// A frame dict `{name, filename, line}`.
pub fn frame(p: &mut Pickler, name: &str, filename: &str, line: u64) {
    p.dict(|p| {
        p.kv("name", |p| {
            p.str(name);
        })
        .kv("filename", |p| {
            p.str(filename);
        })
        .kv("line", |p| {
            p.int(line);
        });
    });
}

/// `{"segments": [segments], "device_traces": [[entries]], "allocator_settings": {...}}`.
pub fn snapshot(conf: &str, segments: impl FnOnce(&mut Pickler), entries: impl FnOnce(&mut Pickler)) -> Vec<u8> {
    let mut p = Pickler::default();
    p.dict(|p| {
        p.kv("segments", |p| {
            p.list(segments);
        })
        .kv("device_traces", |p| {
            p.list(|p| {
                p.list(entries);
            });
        })
        .kv("allocator_settings", |p| {
            p.dict(|p| {
                p.kv("PYTORCH_CUDA_ALLOC_CONF", |p| {
                    p.str(conf);
                });
            });
        });
    });
    p.finish()
}

/// A segment dict of the snapshot's `segments` with `blocks` as
/// `(size, state)`, tiling it from its address.
pub fn segment(p: &mut Pickler, addr: u64, total: u64, small: bool, blocks: &[(u64, &str)]) {
    let blocks: Vec<(u64, u64, &str)> = blocks.iter().map(|&(size, state)| (size, size, state)).collect();
    segment_of(p, Segment { addr, total, stream: 0, small, pool: (0, 0), expandable: false }, &blocks);
}

/// What a segment dict says of its segment.
pub struct Segment {
    pub addr: u64,
    pub total: u64,
    pub stream: u64,
    pub small: bool,
    pub pool: (u64, u64),
    pub expandable: bool,
}

/// A segment dict with every field a replay reads, `blocks` as
/// `(size, requested_size, state)` tiling it from its address.
pub fn segment_of(p: &mut Pickler, s: Segment, blocks: &[(u64, u64, &str)]) {
    p.dict(|p| {
        p.kv("device", |p| {
            p.int(0);
        })
        .kv("address", |p| {
            p.int(s.addr);
        })
        .kv("total_size", |p| {
            p.int(s.total);
        })
        .kv("stream", |p| {
            p.int(s.stream);
        })
        .kv("segment_type", |p| {
            p.str(if s.small { "small" } else { "large" });
        })
        .kv("segment_pool_id", |p| {
            p.tuple2(s.pool.0, s.pool.1);
        })
        .kv("is_expandable", |p| {
            p.bool(s.expandable);
        })
        .kv("blocks", |p| {
            p.list(|p| {
                for &(size, requested, state) in blocks {
                    p.dict(|p| {
                        p.kv("size", |p| {
                            p.int(size);
                        })
                        .kv("requested_size", |p| {
                            p.int(requested);
                        })
                        .kv("state", |p| {
                            p.str(state);
                        });
                    });
                }
            });
        });
    });
}

/// A recording of `n` iterations on one 20 MiB segment: iteration `i` asks
/// `size(i)` bytes and frees them, then an `Optimizer.step` marker ends it.
pub fn iterations_snapshot(n: u64, size: impl Fn(u64) -> u64) -> Vec<u8> {
    let base = 0x7f00_0000_0000u64;
    let mut p = Pickler::default();
    p.dict(|p| {
        p.kv("segments", |p| {
            p.list(|p| segment(p, base, 20 << 20, false, &[(20 << 20, "inactive")]));
        })
        .kv("device_traces", |p| {
            p.list(|p| {
                p.list(|p| {
                    entry_at(p, 0, "segment_alloc", base, 20 << 20, 0, |_| {});
                    for i in 0..n {
                        let (t, s) = (10 * i + 1, size(i));
                        entry_at(p, t, "alloc", base, s, 0, |_| {});
                        entry_at(p, t + 1, "free_requested", base, s, 0, |_| {});
                        entry_at(p, t + 2, "free_completed", base, s, 0, |_| {});
                    }
                });
            });
        })
        .kv("external_annotations", |p| {
            p.list(|p| {
                for i in 0..n {
                    p.dict(|p| {
                        p.kv("device", |p| {
                            p.int(0);
                        })
                        .kv("time_us", |p| {
                            p.int(10 * i + 5);
                        })
                        .kv("stage", |p| {
                            p.str("END");
                        })
                        .kv("name", |p| {
                            p.str("Optimizer.step#SGD.step");
                        });
                    });
                }
            });
        });
    });
    p.finish()
}
