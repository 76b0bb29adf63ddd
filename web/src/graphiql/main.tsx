// GraphiQL, served by `leasehold serve` itself (no script, style or font from another host),
// with the Authorization header preset from the dashboard's sign-in in this tab, if any.
import { createGraphiQLFetcher } from '@graphiql/toolkit';
import { GraphiQL } from 'graphiql';
import 'graphiql/style.css';
import { StrictMode } from 'react';
import { createRoot } from 'react-dom/client';

const token = sessionStorage.getItem('leasehold.token');
const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
// Sent with every request, the schema's introspection at start included (the headers editor
// only reaches the requests run from it); what the editor sets wins.
const authorization = token ? { Authorization: `Bearer ${token}` } : undefined;
const fetcher = createGraphiQLFetcher({
  url: '/graphql',
  headers: authorization,
  subscriptionUrl: `${scheme}://${location.host}/graphql/ws`,
  wsConnectionParams: token ? { authorization: `Bearer ${token}` } : undefined,
});
const headers = authorization ? JSON.stringify(authorization, null, 2) : undefined;

const QUERY = `# Leasehold's GraphQL API. Set your token in the headers below
# (the dashboard's sign-in sets it in this tab) and run with Ctrl-Enter.
query Workloads {
  workloads(first: 10) {
    edges { node { kind id state resources { sku quantity } } }
  }
}
`;

const root = document.getElementById('graphiql');
if (root) {
  createRoot(root).render(
    <StrictMode>
      <GraphiQL fetcher={fetcher} defaultHeaders={headers} defaultQuery={QUERY} />
    </StrictMode>,
  );
}
