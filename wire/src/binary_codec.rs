//! What the binary headers of every family share (the cache's, `binary.rs`, and the
//! groups', `binary_groups.rs`): a checked reader, the error naming the family, strings
//! with a length, and the JSON fallback for what has no binary form.

use crate::frame::FrameError;

/// A cursor over a binary header: every read is checked against what is left. Errors name
/// the header's family (`label`: "binary cache header", "binary group header").
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    label: &'static str,
}

/// A header error of the family `label`.
pub(crate) fn bad_in(label: &str, what: impl std::fmt::Display) -> FrameError {
    FrameError::BadHeader(format!("{label}: {what}"))
}

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], FrameError> {
        if self.buf.len() < n {
            return Err(bad_in(
                self.label,
                format_args!(
                    "{what} cut short ({n} bytes needed, {} left)",
                    self.buf.len()
                ),
            ));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    pub(crate) fn u8(&mut self, what: &str) -> Result<u8, FrameError> {
        Ok(self.take(1, what)?[0])
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, FrameError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes(b.try_into().expect("4 bytes taken")))
    }

    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, FrameError> {
        let b = self.take(8, what)?;
        Ok(u64::from_be_bytes(b.try_into().expect("8 bytes taken")))
    }

    pub(crate) fn string(&mut self, what: &str) -> Result<String, FrameError> {
        let len = self.take(2, what)?;
        let len = u16::from_be_bytes([len[0], len[1]]) as usize;
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| bad_in(self.label, format_args!("{what} is not UTF-8")))
    }

    pub(crate) fn end(&self) -> Result<(), FrameError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(bad_in(
                self.label,
                format_args!("{} bytes after the last field", self.buf.len()),
            ))
        }
    }

    /// What is left unread.
    pub(crate) fn left(&self) -> usize {
        self.buf.len()
    }

    /// A header of the family `label`, whose first byte must be `tag`.
    pub(crate) fn start_tagged(
        buf: &'a [u8],
        tag: u8,
        label: &'static str,
        kind: &str,
    ) -> Result<Reader<'a>, FrameError> {
        let mut r = Reader { buf, label };
        if r.u8(kind)? != tag {
            return Err(bad_in(
                label,
                format_args!("{kind} does not start with the binary tag"),
            ));
        }
        Ok(r)
    }
}

/// `s` with a two-byte length before it; `None` when it is longer than that can say.
pub(crate) fn put_str(out: &mut Vec<u8>, s: &str) -> Option<()> {
    let len = u16::try_from(s.len()).ok()?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(s.as_bytes());
    Some(())
}

pub(crate) fn json(message: &impl serde::Serialize) -> Vec<u8> {
    // Serializing our own message types cannot fail (no maps with non-string keys).
    serde_json::to_vec(message).unwrap_or_default()
}
