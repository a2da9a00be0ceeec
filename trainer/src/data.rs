//! Training text: a seeded Markov chain over a small alphabet (no download
//! needed, learnable structure: each character has a few likely successors),
//! or any text file. Batches are a pure function of (seed, step, row), so
//! every mode — single process, DDP on any number of ranks, a resumed run —
//! sees exactly the same global batch at a given step.

/// Characters the generated text uses.
const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz .,";

/// A character-level corpus.
pub struct Corpus {
    /// The text as token ids.
    pub tokens: Vec<u32>,
    /// id -> character.
    pub vocab: Vec<u8>,
}

/// SplitMix64: a small, good, seedable generator.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u = self.uniform().max(1e-300);
        let v = self.uniform();
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

impl Corpus {
    /// `len` characters of seeded Markov text.
    pub fn markov(seed: u64, len: usize) -> Corpus {
        let n = ALPHABET.len();
        let mut rng = Rng(seed);
        // Each character gets 3 favourite successors carrying 90 % of the mass.
        let table: Vec<[usize; 3]> = (0..n)
            .map(|_| [0, 1, 2].map(|_| (rng.next_u64() % n as u64) as usize))
            .collect();
        let mut cur = 0usize;
        let tokens = (0..len)
            .map(|_| {
                let u = rng.uniform();
                cur = if u < 0.9 {
                    table[cur][(u / 0.3) as usize % 3]
                } else {
                    (rng.next_u64() % n as u64) as usize
                };
                cur as u32
            })
            .collect();
        Corpus {
            tokens,
            vocab: ALPHABET.to_vec(),
        }
    }

    /// A text file, one token per distinct byte.
    pub fn from_file(path: &str) -> std::io::Result<Corpus> {
        let bytes = std::fs::read(path)?;
        let mut vocab: Vec<u8> = bytes.clone();
        vocab.sort_unstable();
        vocab.dedup();
        if vocab.len() < 2 || bytes.len() < 64 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{path}: need at least 64 bytes and 2 distinct characters"),
            ));
        }
        let tokens = bytes
            .iter()
            .map(|b| vocab.binary_search(b).unwrap() as u32)
            .collect();
        Ok(Corpus { tokens, vocab })
    }

    /// Rows `rows` of the global batch of `step`: (inputs, targets), each
    /// `rows.len() * seq` ids, targets shifted by one.
    pub fn batch(
        &self,
        seed: u64,
        step: u64,
        rows: std::ops::Range<usize>,
        seq: usize,
    ) -> (Vec<u32>, Vec<u32>) {
        let span = self.tokens.len() - seq - 1;
        let mut x = Vec::with_capacity(rows.len() * seq);
        let mut y = Vec::with_capacity(rows.len() * seq);
        for row in rows {
            let mut r = Rng(seed
                ^ step.wrapping_mul(0x1000_0000_01b3)
                ^ (row as u64).wrapping_mul(0x9e37_79b9));
            let start = (r.next_u64() % span as u64) as usize;
            x.extend_from_slice(&self.tokens[start..start + seq]);
            y.extend_from_slice(&self.tokens[start + 1..start + seq + 1]);
        }
        (x, y)
    }
}
