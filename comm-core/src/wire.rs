//! Total decoding of bytes from the network: every read is bounds-checked
//! and turns into `Error::Protocol`, never a panic; length fields are capped
//! before anything is allocated.

use crate::error::{Error, Result};
use std::io::{Read, Write};

/// A cursor over received bytes.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// Decode `buf`, naming `what` in errors.
    pub fn new(buf: &'a [u8], what: &'static str) -> Reader<'a> {
        Reader { buf, pos: 0, what }
    }

    fn short(&self, need: usize) -> Error {
        Error::Protocol(format!(
            "{} truncated: needed {need} more bytes at offset {} of {}",
            self.what,
            self.pos,
            self.buf.len()
        ))
    }

    /// The next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.buf.len() - self.pos < n {
            return Err(self.short(n));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// A fixed-size array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }

    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.bytes(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A u16-length-prefixed UTF-8 string of at most `max` bytes.
    pub fn string(&mut self, max: usize) -> Result<String> {
        let n = self.u16()? as usize;
        if n > max {
            return Err(Error::Protocol(format!(
                "{}: string of {n} bytes exceeds limit {max}",
                self.what
            )));
        }
        let b = self.bytes(n)?;
        String::from_utf8(b.to_vec())
            .map_err(|_| Error::Protocol(format!("{}: string is not UTF-8", self.what)))
    }

    /// A u16-length-prefixed byte blob of at most `max` bytes.
    pub fn blob(&mut self, max: usize) -> Result<&'a [u8]> {
        let n = self.u16()? as usize;
        if n > max {
            return Err(Error::Protocol(format!(
                "{}: blob of {n} bytes exceeds limit {max}",
                self.what
            )));
        }
        self.bytes(n)
    }

    /// Fail unless every byte was consumed.
    pub fn finish(&self) -> Result<()> {
        if self.pos != self.buf.len() {
            return Err(Error::Protocol(format!(
                "{}: {} unexpected trailing bytes",
                self.what,
                self.buf.len() - self.pos
            )));
        }
        Ok(())
    }
}

/// Encoding helpers on a byte vector.
pub trait Put {
    fn put_u8(&mut self, v: u8);
    fn put_u16(&mut self, v: u16);
    fn put_u32(&mut self, v: u32);
    fn put_u64(&mut self, v: u64);
    /// u16 length prefix, then the bytes (truncated to 65535).
    fn put_blob(&mut self, b: &[u8]);
    fn put_str(&mut self, s: &str);
}

impl Put for Vec<u8> {
    fn put_u8(&mut self, v: u8) {
        self.push(v)
    }
    fn put_u16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_le_bytes())
    }
    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_le_bytes())
    }
    fn put_u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_le_bytes())
    }
    fn put_blob(&mut self, b: &[u8]) {
        let b = &b[..b.len().min(u16::MAX as usize)];
        self.put_u16(b.len() as u16);
        self.extend_from_slice(b)
    }
    fn put_str(&mut self, s: &str) {
        let mut end = s.len().min(u16::MAX as usize);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.put_blob(&s.as_bytes()[..end])
    }
}

/// Largest frame any control or bootstrap message may have.
pub const MAX_FRAME: usize = 1 << 20;

/// Write a u32-length-prefixed frame.
pub fn write_frame(w: &mut impl Write, payload: &[u8]) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(4 + payload.len());
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(payload);
    w.write_all(&buf)
}

/// Read a u32-length-prefixed frame of at most `max` bytes. `Ok(None)` on a
/// clean end of stream before the first byte.
pub fn read_frame(r: &mut impl Read, max: usize) -> Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match read_exact_or_eof(r, &mut len) {
        Ok(false) => return Ok(None),
        Ok(true) => {}
        Err(e) => return Err(Error::Protocol(format!("reading frame length: {e}"))),
    }
    let n = u32::from_le_bytes(len) as usize;
    if n > max {
        return Err(Error::Protocol(format!(
            "frame of {n} bytes exceeds limit {max}"
        )));
    }
    let mut buf = vec![0u8; n];
    r.read_exact(&mut buf)
        .map_err(|e| Error::Protocol(format!("reading frame body: {e}")))?;
    Ok(Some(buf))
}

/// `read_exact`, but a clean EOF before the first byte is `Ok(false)`.
pub fn read_exact_or_eof(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_never_panics_on_short_or_oversized_input() {
        let mut r = Reader::new(&[1, 2, 3], "test");
        assert!(r.u32().is_err());
        let mut r = Reader::new(&[0xff, 0xff, 1], "test");
        assert!(r.string(100).is_err());
        let mut v = Vec::new();
        v.put_str("héllo");
        v.put_u64(7);
        let mut r = Reader::new(&v, "test");
        assert_eq!(r.string(100).unwrap(), "héllo");
        assert_eq!(r.u64().unwrap(), 7);
        r.finish().unwrap();
    }

    #[test]
    fn frames_are_capped_before_allocation() {
        let mut bytes = (u32::MAX).to_le_bytes().to_vec();
        bytes.extend_from_slice(&[0; 8]);
        assert!(read_frame(&mut bytes.as_slice(), MAX_FRAME).is_err());
        let mut ok = Vec::new();
        write_frame(&mut ok, b"abc").unwrap();
        assert_eq!(read_frame(&mut ok.as_slice(), 10).unwrap().unwrap(), b"abc");
        assert_eq!(read_frame(&mut (&[][..]), 10).unwrap(), None);
    }
}
