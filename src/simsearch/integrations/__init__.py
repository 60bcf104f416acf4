"""Adapters for the frameworks retrieval users start from (docs/integrations.md): LangChain's
``VectorStore`` (``simsearch.integrations.langchain``, extra ``langchain``) and LlamaIndex's
vector store (``simsearch.integrations.llamaindex``, extra ``llamaindex``). Each stores in an
embedded in-memory collection by default, or in any collection ``simsearch.connect`` reaches.
"""
