// Queries over HTTP (`POST /graphql`), as the GraphQL-over-HTTP specification's current media
// type; subscriptions are in `live.ts`.

/** A GraphQL error, with the code the gateway gives every error (`extensions.code`). */
export class ApiError extends Error {
  constructor(
    message: string,
    readonly code: string,
  ) {
    super(message);
  }
}

interface GraphQLResponse<T> {
  data?: T | null;
  errors?: { message: string; extensions?: { code?: string } }[];
}

/** Runs `query` with `token`; with `minCursor`, the read models answer no older than it (the
 * cursor of the last event the page saw, so a list shows what the feed just showed). */
export async function graphql<T>(
  token: string,
  query: string,
  variables: Record<string, unknown> = {},
  minCursor?: string,
): Promise<T> {
  const body: Record<string, unknown> = { query, variables };
  if (minCursor) body.extensions = { minCursor };
  let response: Response;
  try {
    response = await fetch('/graphql', {
      method: 'POST',
      headers: {
        accept: 'application/graphql-response+json, application/json;q=0.9',
        'content-type': 'application/json',
        authorization: `Bearer ${token}`,
      },
      body: JSON.stringify(body),
    });
  } catch {
    throw new ApiError('The server cannot be reached.', 'UNAVAILABLE');
  }
  let answer: GraphQLResponse<T>;
  try {
    answer = (await response.json()) as GraphQLResponse<T>;
  } catch {
    throw new ApiError(`The server answered ${response.status} with no GraphQL response.`, 'UNAVAILABLE');
  }
  const error = answer.errors?.[0];
  if (error) throw new ApiError(error.message, error.extensions?.code ?? 'INTERNAL');
  if (!answer.data) throw new ApiError('The server answered with no data.', 'INTERNAL');
  return answer.data;
}
