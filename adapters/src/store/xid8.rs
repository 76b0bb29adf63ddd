//! PostgreSQL's `xid8` (a 64-bit transaction id) in binary form, so readers neither format it
//! as text on the server nor parse it on the client.

use std::error::Error;

use bytes::{BufMut, BytesMut};
use tokio_postgres::types::{FromSql, IsNull, ToSql, Type, to_sql_checked};

/// A transaction id as `xid8` carries it: 8 bytes, big-endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Xid8(pub u64);

fn is_xid8(ty: &Type) -> bool {
    ty.name() == "xid8"
}

impl<'a> FromSql<'a> for Xid8 {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn Error + Sync + Send>> {
        let bytes: [u8; 8] = raw.try_into().map_err(|_| "an xid8 is 8 bytes long")?;
        Ok(Xid8(u64::from_be_bytes(bytes)))
    }

    fn accepts(ty: &Type) -> bool {
        is_xid8(ty)
    }
}

impl ToSql for Xid8 {
    fn to_sql(&self, _: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        out.put_u64(self.0);
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        is_xid8(ty)
    }

    to_sql_checked!();
}
