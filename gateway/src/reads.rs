//! Which projections a query reads, so that read-your-writes (`minCursor`) waits for those
//! and no other: a query of leases does not wait for a lagging projection of another kind.
//! Each kind's GraphQL module names the projection its fields read; the queries over every
//! kind (workloads, quota usage) read every projection, and the log's own queries none.

use async_graphql::parser::types::{ExecutableDocument, Selection};

pub use crate::schema::KIND_READS;

/// What one kind's root query fields read. Each kind's GraphQL module declares one (as
/// `schema::lease::READS`); the list of every kind's sits beside the roots they are merged
/// into (`schema/mod.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KindReads {
    /// The kind's stream type: its entry in the domain's registry.
    pub stream_type: &'static str,
    /// The projection of the kind's read models (one `serve` runs: a test in `ops` holds it to
    /// that, or a read-your-writes wait for it would wait for nothing).
    pub projection: &'static str,
    /// Root query fields that read that projection.
    pub projection_fields: &'static [&'static str],
    /// Root query fields that read the kind's streams in the log and no read model: they wait
    /// only for the log to let the cursor through.
    pub log_fields: &'static [&'static str],
    /// Other projections the `projection_fields` join to (a rental beside its node): they
    /// wait for those too.
    pub joins: &'static [&'static str],
}

/// Root query fields over the log itself (and introspection), and over what no projection
/// writes (`backends`): they wait for no projection.
pub const LOG_FIELDS: &[&str] =
    &["events", "projections", "backends", "__typename", "__schema", "__type"];

/// Root query fields over every kind's read models (the shared tables every projection
/// writes, and `dead_letters`, which the VM, host, snapshot and runner fleet projections
/// write): they wait for every projection.
pub const EVERY_KIND_FIELDS: &[&str] =
    &["workloads", "quotaUsage", "tenantQuotaUsage", "deadLetters"];

/// Every projection a field waits for.
pub fn projections_named() -> impl Iterator<Item = &'static str> {
    KIND_READS.iter().map(|kind| kind.projection)
}

/// What a query reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reads {
    /// Only these projections.
    Some(Vec<&'static str>),
    /// Every projection.
    All,
}

impl Reads {
    fn with(self, other: Reads) -> Reads {
        match (self, other) {
            (Reads::Some(mut mine), Reads::Some(theirs)) => {
                for name in theirs {
                    if !mine.contains(&name) {
                        mine.push(name);
                    }
                }
                Reads::Some(mine)
            }
            _ => Reads::All,
        }
    }
}

/// The projections a root field reads. A field nobody listed reads every projection: a new
/// field waits for everything until someone says what it reads (and a test in this module
/// fails until someone does).
fn reads_of_field(name: &str) -> Reads {
    if LOG_FIELDS.contains(&name) {
        return Reads::Some(vec![]);
    }
    for kind in KIND_READS {
        if kind.projection_fields.contains(&name) {
            return Reads::Some(
                [kind.projection].into_iter().chain(kind.joins.iter().copied()).collect(),
            );
        }
        if kind.log_fields.contains(&name) {
            return Reads::Some(vec![]);
        }
    }
    Reads::All
}

/// What the operations of `query` read (every projection when it does not parse: the
/// executor then refuses it anyway).
pub(crate) fn reads_of(query: &str) -> Reads {
    match async_graphql::parser::parse_query(query) {
        Ok(document) => reads_of_document(&document),
        Err(_) => Reads::All,
    }
}

fn reads_of_document(document: &ExecutableDocument) -> Reads {
    let mut reads = Reads::Some(Vec::new());
    for (_, operation) in document.operations.iter() {
        for selection in &operation.node.selection_set.node.items {
            reads = match &selection.node {
                Selection::Field(field) => {
                    reads.with(reads_of_field(field.node.name.node.as_str()))
                }
                // Fragments at the root: not worth resolving here.
                _ => Reads::All,
            };
        }
    }
    reads
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_waits_for_what_it_reads() {
        assert_eq!(reads_of("{ leases { edges { cursor } } }"), Reads::Some(vec!["lease_views"]));
        assert_eq!(reads_of("{ events(first: 1) { edges { cursor } } }"), Reads::Some(vec![]));
        assert_eq!(
            reads_of("{ lease(id: \"x\") { id } events { edges { cursor } } }"),
            Reads::Some(vec!["lease_views"])
        );
        assert_eq!(reads_of("{ workloads { edges { cursor } } }"), Reads::All);
        assert_eq!(
            reads_of("{ ...F } fragment F on Query { leases { edges { cursor } } }"),
            Reads::All
        );
        assert_eq!(reads_of("{ newFieldNobodyListed }"), Reads::All);
        assert_eq!(reads_of("not graphql"), Reads::All);
        assert_eq!(reads_of("{ leaseWork(id: \"x\") { id } }"), Reads::Some(vec![]));
    }

    /// Every root query field of the schema is declared by exactly one of: the log's fields,
    /// the fields over every kind, or one kind's fields. A new field fails this until its
    /// module says what it reads.
    #[test]
    fn every_root_query_field_says_what_it_reads() {
        let sdl = crate::schema::sdl();
        let document = async_graphql::parser::parse_schema(&sdl).expect("the SDL parses");
        let fields = query_fields(&document);
        assert!(fields.contains(&"leases".to_string()), "{fields:?}");
        for field in &fields {
            let mut declared = usize::from(LOG_FIELDS.contains(&field.as_str()))
                + usize::from(EVERY_KIND_FIELDS.contains(&field.as_str()));
            for kind in KIND_READS {
                declared += usize::from(kind.projection_fields.contains(&field.as_str()))
                    + usize::from(kind.log_fields.contains(&field.as_str()));
            }
            assert_eq!(
                declared, 1,
                "root field {field}: say once, in its kind's READS, what it reads"
            );
        }
    }

    fn query_fields(document: &async_graphql::parser::types::ServiceDocument) -> Vec<String> {
        use async_graphql::parser::types::{TypeKind, TypeSystemDefinition};
        document
            .definitions
            .iter()
            .filter_map(|definition| match definition {
                TypeSystemDefinition::Type(ty) if ty.node.name.node == "Query" => {
                    match &ty.node.kind {
                        TypeKind::Object(object) => Some(
                            object.fields.iter().map(|f| f.node.name.node.to_string()).collect(),
                        ),
                        _ => None,
                    }
                }
                _ => None,
            })
            .next()
            .unwrap_or_default()
    }
}
