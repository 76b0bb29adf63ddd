//! Rows for a binary `COPY … FROM STDIN`, handed to the connection in large messages.
//!
//! tokio-postgres's `BinaryCopyInWriter` hands the connection one message every 4 KiB and waits
//! for it to be taken each time: an import of a million events would switch between the two
//! some two hundred thousand times. This writer encodes the same format (PostgreSQL's binary
//! `COPY` header, each row's field count, each field's length and bytes, the trailer) and
//! hands it over every 256 KiB.

use std::pin::Pin;

use bytes::{BufMut as _, Bytes, BytesMut};
use futures_util::SinkExt as _;
use tokio_postgres::CopyInSink;
use tokio_postgres::types::{IsNull, ToSql, Type};

/// Bytes encoded before they are handed to the connection.
const MESSAGE_BYTES: usize = 256 * 1024;

/// The binary `COPY` format's signature, flags and header extension length.
const HEADER: &[u8] = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";

/// Why a row could not be copied.
#[derive(Debug)]
pub(crate) enum CopyError {
    /// The driver failed.
    Driver(tokio_postgres::Error),
    /// A value could not be encoded as its column's type.
    Value(String),
}

/// One `COPY … FROM STDIN (FORMAT binary)` in progress.
pub(crate) struct CopyRows {
    sink: Pin<Box<CopyInSink<Bytes>>>,
    types: Vec<Type>,
    buf: BytesMut,
}

impl CopyRows {
    /// Rows of `types` (the columns the `COPY` names, in order) into `sink`.
    pub(crate) fn new(sink: CopyInSink<Bytes>, types: &[Type]) -> Self {
        let mut buf = BytesMut::with_capacity(MESSAGE_BYTES + 64 * 1024);
        buf.put_slice(HEADER);
        Self { sink: Box::pin(sink), types: types.to_vec(), buf }
    }

    /// Encodes one row (a value per column), handing the buffer over once it is large.
    pub(crate) async fn write(&mut self, row: &[&(dyn ToSql + Sync)]) -> Result<(), CopyError> {
        self.buf.put_i16(i16::try_from(row.len()).unwrap_or(i16::MAX));
        for (value, ty) in row.iter().zip(&self.types) {
            let at = self.buf.len();
            self.buf.put_i32(0);
            let encoded = value.to_sql_checked(ty, &mut self.buf);
            let len = match encoded.map_err(|error| CopyError::Value(error.to_string()))? {
                IsNull::Yes => -1,
                IsNull::No => i32::try_from(self.buf.len() - at - 4).unwrap_or(i32::MAX),
            };
            self.buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
        }
        if self.buf.len() >= MESSAGE_BYTES {
            self.sink.send(self.buf.split().freeze()).await.map_err(CopyError::Driver)?;
        }
        Ok(())
    }

    /// Ends the `COPY`; the rows it added.
    pub(crate) async fn finish(mut self) -> Result<u64, CopyError> {
        self.buf.put_i16(-1);
        self.sink.send(self.buf.split().freeze()).await.map_err(CopyError::Driver)?;
        self.sink.as_mut().finish().await.map_err(CopyError::Driver)
    }
}
