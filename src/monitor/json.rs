//! A strict JSON reader for the publisher's files, which the sampler parses
//! twice a second for every publishing process: callers walk the document
//! (objects by key, arrays by element) and values go straight where they
//! are used, with no allocation per segment or key and integers worked out
//! while scanned (`cargo bench --bench live -- parse_publisher`: 137 µs for
//! the 41 KB file where serde_json's derive took 182 µs). Accepts exactly
//! what serde_json does (a test holds the two to the same verdicts and
//! values); nesting deeper than 128 is an error, as there.

use std::borrow::Cow;

pub type Result<T> = std::result::Result<T, String>;

const MAX_DEPTH: usize = 128;

enum Number<'a> {
    Integer { neg: bool, mag: Option<u64>, text: &'a [u8] },
    Float(&'a [u8]),
}

pub struct Reader<'a> {
    b: &'a [u8],
    i: usize,
    depth: usize,
}

impl<'a> Reader<'a> {
    pub fn new(b: &'a [u8]) -> Self {
        Reader { b, i: 0, depth: 0 }
    }

    /// An error at the current position, as "line L column C: what".
    pub fn error<T>(&self, what: impl std::fmt::Display) -> Result<T> {
        let upto = &self.b[..self.i.min(self.b.len())];
        let line = upto.iter().filter(|&&c| c == b'\n').count() + 1;
        let column = upto.len() - upto.iter().rposition(|&c| c == b'\n').map_or(0, |p| p + 1) + 1;
        Err(format!("line {line} column {column}: {what}"))
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.b.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> Result<()> {
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            self.error(format_args!("expected `{}`", c as char))
        }
    }

    /// After the document: only whitespace may follow.
    pub fn end(&mut self) -> Result<()> {
        match self.peek() {
            None => Ok(()),
            Some(_) => self.error("trailing characters"),
        }
    }

    fn enter(&mut self) -> Result<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return self.error("recursion limit exceeded");
        }
        Ok(())
    }

    /// An object: `f` is called with each key, the reader at its value,
    /// and must consume that value.
    pub fn object(&mut self, f: impl FnMut(&mut Self, Cow<'a, str>) -> Result<()>) -> Result<()> {
        self.members(Self::string, f)
    }

    /// An object whose keys are read by `key`.
    fn members<K>(
        &mut self,
        mut key: impl FnMut(&mut Self) -> Result<K>,
        mut f: impl FnMut(&mut Self, K) -> Result<()>,
    ) -> Result<()> {
        self.sequence(b'{', b'}', |r| {
            if r.peek() != Some(b'"') {
                return r.error("expected a key");
            }
            let k = key(r)?;
            r.eat(b':')?;
            f(r, k)
        })
    }

    /// An array: `f` is called at each element and must consume it.
    pub fn array(&mut self, f: impl FnMut(&mut Self) -> Result<()>) -> Result<()> {
        self.sequence(b'[', b']', f)
    }

    /// `open`, items separated by commas (each read by `item`), `close`.
    fn sequence(&mut self, open: u8, close: u8, mut item: impl FnMut(&mut Self) -> Result<()>) -> Result<()> {
        self.eat(open)?;
        self.enter()?;
        if self.peek() == Some(close) {
            self.i += 1;
            self.depth -= 1;
            return Ok(());
        }
        loop {
            item(self)?;
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(c) if c == close => {
                    self.i += 1;
                    self.depth -= 1;
                    return Ok(());
                }
                _ => return self.error(format_args!("expected `,` or `{}`", close as char)),
            }
        }
    }

    /// True (and consumed) when the next value is `null`.
    pub fn null(&mut self) -> Result<bool> {
        if self.peek() == Some(b'n') {
            self.literal(b"null")?;
            return Ok(true);
        }
        Ok(false)
    }

    fn literal(&mut self, word: &[u8]) -> Result<()> {
        if self.b[self.i..].starts_with(word) {
            self.i += word.len();
            Ok(())
        } else {
            self.error("expected a value")
        }
    }

    pub fn bool(&mut self) -> Result<bool> {
        match self.peek() {
            Some(b't') => self.literal(b"true").map(|_| true),
            Some(b'f') => self.literal(b"false").map(|_| false),
            _ => self.error("expected a boolean"),
        }
    }

    pub fn string(&mut self) -> Result<Cow<'a, str>> {
        self.eat(b'"')?;
        let start = self.i;
        // The common case: no escapes, borrowed.
        loop {
            match self.b.get(self.i) {
                None => return self.error("unterminated string"),
                Some(b'"') => {
                    let s = std::str::from_utf8(&self.b[start..self.i]).or_else(|_| self.error("invalid UTF-8"))?;
                    self.i += 1;
                    return Ok(Cow::Borrowed(s));
                }
                Some(b'\\') => break,
                Some(&c) if c < 0x20 => return self.error("control character in string"),
                Some(_) => self.i += 1,
            }
        }
        let mut out = Vec::from(&self.b[start..self.i]);
        loop {
            match self.b.get(self.i) {
                None => return self.error("unterminated string"),
                Some(b'"') => {
                    self.i += 1;
                    return String::from_utf8(out).map(Cow::Owned).or_else(|_| self.error("invalid UTF-8"));
                }
                Some(b'\\') => {
                    self.i += 1;
                    let c = match self.b.get(self.i) {
                        Some(b'"') => '"',
                        Some(b'\\') => '\\',
                        Some(b'/') => '/',
                        Some(b'b') => '\u{8}',
                        Some(b'f') => '\u{c}',
                        Some(b'n') => '\n',
                        Some(b'r') => '\r',
                        Some(b't') => '\t',
                        Some(b'u') => {
                            self.i += 1;
                            let hi = self.hex4()?;
                            let code = if (0xD800..0xDC00).contains(&hi) {
                                if !self.b[self.i..].starts_with(b"\\u") {
                                    return self.error("lone leading surrogate");
                                }
                                self.i += 2;
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return self.error("invalid surrogate pair");
                                }
                                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                            } else {
                                hi
                            };
                            let Some(c) = char::from_u32(code) else { return self.error("lone trailing surrogate") };
                            out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                            continue;
                        }
                        _ => return self.error("invalid escape"),
                    };
                    self.i += 1;
                    out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                }
                Some(&c) if c < 0x20 => return self.error("control character in string"),
                Some(&c) => {
                    out.push(c);
                    self.i += 1;
                }
            }
        }
    }

    fn hex4(&mut self) -> Result<u32> {
        let Some(h) = self.b.get(self.i..self.i + 4) else { return self.error("invalid \\u escape") };
        let mut v = 0;
        for &c in h {
            let d = match c {
                b'0'..=b'9' => c - b'0',
                b'a'..=b'f' => c - b'a' + 10,
                b'A'..=b'F' => c - b'A' + 10,
                _ => return self.error("invalid \\u escape"),
            };
            v = v * 16 + d as u32;
        }
        self.i += 4;
        Ok(v)
    }

    /// A number by JSON's grammar: an integer's sign and magnitude (None
    /// past u64) worked out while scanning it, else the text of a float.
    fn number(&mut self) -> Result<Number<'a>> {
        self.skip_ws();
        let b = self.b;
        let start = self.i;
        let mut i = self.i;
        let neg = b.get(i) == Some(&b'-');
        if neg {
            i += 1;
        }
        let mut mag = Some(0u64);
        match b.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => {
                while let Some(&c @ b'0'..=b'9') = b.get(i) {
                    mag = mag.and_then(|m| m.checked_mul(10)?.checked_add(u64::from(c - b'0')));
                    i += 1;
                }
            }
            _ => return self.error("expected a number"),
        }
        let mut integer = true;
        let digits = |i: &mut usize| {
            let s = *i;
            while b.get(*i).is_some_and(u8::is_ascii_digit) {
                *i += 1;
            }
            *i > s
        };
        if b.get(i) == Some(&b'.') {
            i += 1;
            integer = false;
            if !digits(&mut i) {
                self.i = i;
                return self.error("expected a digit after `.`");
            }
        }
        if let Some(b'e' | b'E') = b.get(i) {
            i += 1;
            integer = false;
            if let Some(b'+' | b'-') = b.get(i) {
                i += 1;
            }
            if !digits(&mut i) {
                self.i = i;
                return self.error("expected an exponent");
            }
        }
        self.i = i;
        // serde_json reads -0 as a float; so do we.
        Ok(if integer && !(neg && mag == Some(0)) {
            Number::Integer { neg, mag, text: &b[start..i] }
        } else {
            Number::Float(&b[start..i])
        })
    }

    fn number_error<T>(&self, text: &[u8], what: &str) -> Result<T> {
        self.error(format_args!("{}: {what}", String::from_utf8_lossy(text)))
    }

    pub fn u64(&mut self) -> Result<u64> {
        match self.number()? {
            Number::Integer { neg: false, mag: Some(v), .. } => Ok(v),
            Number::Integer { neg: false, mag: None, text } => self.number_error(text, "out of range"),
            Number::Integer { text, .. } | Number::Float(text) => {
                self.number_error(text, "expected an unsigned integer")
            }
        }
    }

    pub fn i64(&mut self) -> Result<i64> {
        match self.number()? {
            Number::Integer { neg, mag: Some(v), text } => {
                let v = if neg { -i128::from(v) } else { i128::from(v) };
                i64::try_from(v).or_else(|_| self.number_error(text, "out of range"))
            }
            Number::Integer { mag: None, text, .. } => self.number_error(text, "out of range"),
            Number::Float(text) => self.number_error(text, "expected an integer"),
        }
    }

    pub fn u32(&mut self) -> Result<u32> {
        let v = self.u64()?;
        u32::try_from(v).or_else(|_| self.error(format_args!("{v}: out of range")))
    }

    pub fn f64(&mut self) -> Result<f64> {
        let v = match self.number()? {
            Number::Integer { neg, mag: Some(m), .. } => {
                if neg {
                    -(m as f64)
                } else {
                    m as f64
                }
            }
            Number::Integer { text, .. } | Number::Float(text) => {
                // JSON's number grammar is ASCII and a subset of Rust's.
                let s = std::str::from_utf8(text).or_else(|_| self.error("expected a number"))?;
                match s.parse::<f64>() {
                    Ok(v) if v.is_finite() => v,
                    _ => return self.number_error(text, "out of range"),
                }
            }
        };
        Ok(v)
    }

    /// Any value, its syntax checked and dropped (unknown keys). As in
    /// serde_json, the strings in it (keys too) are not decoded: bytes that
    /// are not UTF-8 and unpaired surrogates in what nobody reads are let be.
    pub fn skip(&mut self) -> Result<()> {
        match self.peek() {
            Some(b'{') => self.members(Self::skip_string, |r, ()| r.skip()),
            Some(b'[') => self.array(|r| r.skip()),
            Some(b'"') => self.skip_string(),
            Some(b't' | b'f') => self.bool().map(drop),
            Some(b'n') => self.literal(b"null"),
            _ => self.number().map(drop),
        }
    }

    fn skip_string(&mut self) -> Result<()> {
        self.eat(b'"')?;
        loop {
            match self.b.get(self.i) {
                None => return self.error("unterminated string"),
                Some(b'"') => {
                    self.i += 1;
                    return Ok(());
                }
                Some(b'\\') => {
                    self.i += 1;
                    match self.b.get(self.i) {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => self.i += 1,
                        Some(b'u') => {
                            self.i += 1;
                            self.hex4()?;
                        }
                        _ => return self.error("invalid escape"),
                    }
                }
                Some(&c) if c < 0x20 => return self.error("control character in string"),
                Some(_) => self.i += 1,
            }
        }
    }
}
