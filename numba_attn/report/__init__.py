"""Result rows → what people read: the terminal table, plots and run comparisons."""
