//! Text from an input made safe to show: frame and file names, settings,
//! command lines and file names come from files and processes we do not
//! trust, and a terminal acts on the control characters in them (a title,
//! the clipboard through OSC 52, a cleared screen, a forged line). Every
//! control character is shown as its JSON-style escape (`\u001b`), which
//! reads the same in text and stays the same value in JSON
//! (docs/design/security.md, "Text from inputs").

use std::borrow::Cow;
use std::io::Write;

/// Whether a terminal may act on `c`: C0 controls, DEL and C1 controls.
fn is_control(c: char) -> bool {
    c.is_control()
}

/// `s` with every control character (newlines and tabs too) escaped.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if is_control(c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A writer for text output that escapes every control character but the
/// newline and the tab, which the text's own layout uses. What an input
/// brings in a single field is escaped where it is formatted (`escape`), so
/// that it cannot start a line either; this catches the rest.
pub struct Escaped<W: Write> {
    inner: W,
    /// A lead byte of a two-byte UTF-8 sequence cut at the end of a write:
    /// C1 controls are `C2 80`–`C2 9F`.
    held: Option<u8>,
}

impl<W: Write> Escaped<W> {
    pub fn new(inner: W) -> Self {
        Escaped { inner, held: None }
    }
}

impl<W: Write> Write for Escaped<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let data: Vec<u8> = self.held.take().into_iter().chain(buf.iter().copied()).collect();
        let mut out = Vec::with_capacity(data.len());
        let mut i = 0;
        while i < data.len() {
            let b = data[i];
            match (b, data.get(i + 1)) {
                (b'\n' | b'\t', _) => out.push(b),
                (0x00..=0x1f | 0x7f, _) => out.extend_from_slice(format!("\\u{b:04x}").as_bytes()),
                // A C1 control, U+0080–U+009F, is C2 80–C2 9F in UTF-8.
                (0xc2, Some(&c)) if (0x80..=0x9f).contains(&c) => {
                    out.extend_from_slice(format!("\\u{c:04x}").as_bytes());
                    i += 1;
                }
                // Its second byte may come with the next write.
                (0xc2, None) => self.held = Some(b),
                _ => out.push(b),
            }
            i += 1;
        }
        self.inner.write_all(&out)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if let Some(p) = self.held.take() {
            self.inner.write_all(&[p])?;
        }
        self.inner.flush()
    }
}

impl<W: Write> Drop for Escaped<W> {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_escaped_and_text_is_kept() {
        assert_eq!(escape("plain ü"), "plain ü");
        assert_eq!(escape("a\u{1b}]0;pwned\u{7}b\nc\u{9b}"), "a\\u001b]0;pwned\\u0007b\\u000ac\\u009b");
    }

    #[test]
    fn the_writer_keeps_lines_and_escapes_the_rest_across_writes() {
        let mut w = Escaped::new(Vec::new());
        w.write_all(b"row\t1\n\x1b[2J ok \xc2").unwrap();
        w.write_all(b"\x9b31m \xc2").unwrap();
        w.write_all(b"\xa0 \xc3\xbc\x07").unwrap();
        // An invalid lead byte before a real C1 control hides nothing.
        w.write_all(b"\xc2\xc2\x9b").unwrap();
        w.flush().unwrap();
        let out = std::mem::take(&mut w.inner);
        assert_eq!(out, b"row\t1\n\\u001b[2J ok \\u009b31m \xc2\xa0 \xc3\xbc\\u0007\xc2\\u009b".to_vec());
    }
}
