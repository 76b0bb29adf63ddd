//! Which projections a query reads, so that read-your-writes (`minCursor`) waits for those
//! and no other: a query of leases does not wait for a lagging projection of another kind.
//! Each kind's GraphQL module names the projection its fields read; the queries over every
//! kind (workloads, quota usage) read every projection, and the log's own queries none.

use async_graphql::parser::types::{ExecutableDocument, Selection};

use crate::schema::lease::LEASE_PROJECTION;

/// Every projection a field names here: each must be one `serve` runs (a test in `ops` holds
/// it to that), or a read-your-writes wait for it would wait for nothing.
pub const PROJECTIONS_NAMED: &[&str] = &[LEASE_PROJECTION];

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

/// The projections a root field reads. A field not listed reads every projection: a new
/// field waits for everything until someone says what it reads.
fn reads_of_field(name: &str) -> Reads {
    match name {
        "lease" | "leases" => Reads::Some(vec![LEASE_PROJECTION]),
        // The log itself, and introspection.
        "events" | "projections" | "__typename" | "__schema" | "__type" => Reads::Some(vec![]),
        _ => Reads::All,
    }
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
    }
}
