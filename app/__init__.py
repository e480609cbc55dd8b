"""Streamlit dashboard over the run store (`lrt-lab app`, or `streamlit run app/streamlit_app.py`).

It reads runs only through `lrt_lab.store.results`; lrt_lab never imports this package.
"""
